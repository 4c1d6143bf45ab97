#include "session/client_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "util/files.h"

namespace sqbox {

ClientConnection ClientConnection::stdio() {
    set_nonblocking(STDIN_FILENO, "a descriptor");
    set_nonblocking(STDOUT_FILENO, "a descriptor");
    return {STDIN_FILENO, STDOUT_FILENO};
}

ClientConnection::ClientConnection(UniqueFd socket)
    : in_fd_(socket.get()), out_fd_(socket.get()), socket_(std::move(socket)) {}

void ClientConnection::read_available(std::string& scratch) {
    for (;;) {
        const ssize_t n = ::read(in_fd_, scratch.data(), scratch.size());
        if (n > 0) {
            input_.append(std::string_view(scratch.data(), static_cast<size_t>(n)));
            if (static_cast<size_t>(n) < scratch.size()) break;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        input_closed_ = true;  // EOF or error
        break;
    }
}

bool ClientConnection::drop_oversized_input() {
    if (input_.compact() <= kMaxRequestBytes) return false;
    input_.clear();
    input_closed_ = true;
    return true;
}

void ClientConnection::send(const json& message) {
    if (broken_) return;
    if (output_.empty()) {
        output_ = dump_line(message);
    } else {
        output_ += dump_line(message);
    }
    flush();
}

void ClientConnection::flush() {
    while (!output_.empty()) {
        const ssize_t n = ::write(out_fd_, output_.data(), output_.size());
        if (n > 0) {
            output_.erase(0, static_cast<size_t>(n));
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        broken_ = true;
        output_.clear();
        return;
    }
}

void ClientConnection::output_ready(short revents) {
    if ((revents & (POLLERR | POLLHUP)) != 0 && (revents & POLLOUT) == 0) {
        broken_ = true;
    } else {
        flush();
    }
}

void ClientConnection::flush_blocking() {
    if (broken_ || output_.empty()) return;
    const int flags = ::fcntl(out_fd_, F_GETFL);
    if (flags >= 0) (void)::fcntl(out_fd_, F_SETFL, flags & ~O_NONBLOCK);
    // The server is ending: a client that cannot take its answers has nothing left to get.
    (void)write_all(out_fd_, output_.data(), output_.size());
}

bool ClientConnection::gone() const {
    return broken_ || (input_closed_ && output_.empty() && is_socket());
}

}  // namespace sqbox

#include "runtime/stdio_relay.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr size_t kChunk = size_t{64} * 1024;

}  // namespace

StdioRelay::StdioRelay(std::optional<uint64_t> output_limit, bool tty) : tty_(tty) {
    if (tty) {
        if (::isatty(STDIN_FILENO) != 1) throw Error("--tty: stdin is not a terminal");
        int pair[2];
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
            throw system_error("--tty: socketpair");
        }
        tty_socket_.reset(pair[0]);
        tty_socket_child_.reset(pair[1]);
        // The terminal carries both output streams; stdout's limit and flag stand for it.
        streams_[0].open = true;
        streams_[1].open = true;
        streams_[1].limit = output_limit;
        return;
    }
    for (int fd = 0; fd < 3; ++fd) {
        Stream& stream = streams_[fd];
        const bool output = fd != STDIN_FILENO;
        stream.relayed = ::isatty(fd) == 1 || (output && output_limit.has_value());
        if (!stream.relayed) continue;
        Pipe pipe = make_pipe("stdio relay");
        if (output) {
            stream.sandbox_end = std::move(pipe.write_end);
            stream.our_end = std::move(pipe.read_end);
            stream.limit = output_limit;
        } else {
            stream.sandbox_end = std::move(pipe.read_end);
            stream.our_end = std::move(pipe.write_end);
        }
        stream.open = true;
    }
}

bool StdioRelay::active() const {
    if (tty_) return true;
    return std::any_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.relayed; });
}

int StdioRelay::install_in_child() {
    tty_socket_.reset();
    int diagnostics = -1;
    if (streams_[2].relayed) {
        diagnostics = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    }
    for (int fd = 0; fd < 3; ++fd) {
        Stream& stream = streams_[fd];
        if (!stream.relayed) continue;
        if (::dup2(stream.sandbox_end.get(), fd) < 0) throw system_error("dup2 for stdio relay");
        stream.sandbox_end.reset();
        stream.our_end.reset();
    }
    return diagnostics;
}

void StdioRelay::close_child_ends() {
    for (auto& stream : streams_) stream.sandbox_end.reset();
    tty_socket_child_.reset();
}

void StdioRelay::attach_terminal() {
    master_ = receive_fd(tty_socket_.get());
    tty_socket_.reset();
    if (!master_) {  // the sandbox ended before its terminal existed
        streams_[0].open = streams_[1].open = false;
        return;
    }
    streams_[1].our_end.reset(::dup(master_.get()));  // read side, polled like an output pipe
    if (!streams_[1].our_end) throw system_error("--tty: dup");
    copy_window_size(STDIN_FILENO, master_.get());
    raw_terminal_.emplace(STDIN_FILENO);
}

void StdioRelay::resize() {
    if (master_) copy_window_size(STDIN_FILENO, master_.get());
}

void StdioRelay::add_to_poll(std::vector<pollfd>& fds) const {
    if (tty_socket_) {
        fds.push_back({tty_socket_.get(), POLLIN, 0});
        return;
    }
    for (int fd = 0; fd < 3; ++fd) {
        const Stream& stream = streams_[fd];
        if (!stream.open) continue;
        if (fd == STDIN_FILENO) {
            fds.push_back({STDIN_FILENO, POLLIN, 0});
        } else {
            fds.push_back({stream.our_end.get(), POLLIN, 0});
        }
    }
}

void StdioRelay::handle_poll(const std::vector<pollfd>& fds) {
    for (const pollfd& entry : fds) {
        if (entry.revents == 0) continue;
        if (tty_socket_ && entry.fd == tty_socket_.get()) {
            attach_terminal();
            return;
        }
        if (entry.fd == STDIN_FILENO && streams_[0].open) {
            copy_input();
            continue;
        }
        for (int fd = 1; fd < 3; ++fd) {
            if (streams_[fd].open && entry.fd == streams_[fd].our_end.get()) copy_output(fd);
        }
    }
}

void StdioRelay::copy_output(int fd_number) {
    Stream& stream = streams_[fd_number];
    char buffer[kChunk];
    ssize_t n = ::read(stream.our_end.get(), buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {  // EOF, or EIO from a terminal master once no process holds the other side
        stream.open = false;
        stream.our_end.reset();
        return;
    }
    auto size = static_cast<uint64_t>(n);
    uint64_t allowed = size;
    if (stream.limit) {
        allowed = std::min(size, *stream.limit - std::min(*stream.limit, stream.passed));
        if (allowed < size) stream.truncated = true;
    }
    // A caller that stopped reading loses the rest; the payload keeps running either way.
    if (allowed > 0) (void)write_all(fd_number, buffer, allowed);
    stream.passed += allowed;
}

void StdioRelay::copy_input() {
    Stream& stream = streams_[0];
    char buffer[kChunk];
    ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    // EOF from the caller, or the payload closed its end (EPIPE): stop relaying input.
    const int to = tty_ ? master_.get() : stream.our_end.get();
    if (n <= 0 || !write_all(to, buffer, static_cast<size_t>(n))) {
        stream.open = false;
        stream.our_end.reset();
    }
}

void StdioRelay::stop_input() {
    streams_[0].open = false;
    streams_[0].our_end.reset();
}

}  // namespace sqbox

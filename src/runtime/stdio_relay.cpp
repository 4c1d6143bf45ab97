#include "runtime/stdio_relay.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr size_t kReadChunk = size_t{64} * 1024;

// /dev/null holds nothing for anyone: output to it needs no relay to be capped.
bool is_null_device(int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
}

// The cap bounds what a caller that keeps the output may have to hold. A terminal keeps nothing
// for its reader (its scrollback is its own bound), and an interactive session's output should
// not stop appearing after a while: output to a terminal, or to /dev/null, is not capped.
std::optional<uint64_t> cap_for(int fd, std::optional<uint64_t> output_limit) {
    if (!output_limit || ::isatty(fd) == 1 || is_null_device(fd)) return std::nullopt;
    return output_limit;
}

}  // namespace

void StdioRelay::Channel::close_source() {
    source = -1;
    owned_source.reset();
}

StdioRelay::StdioRelay(std::optional<uint64_t> output_limit, bool tty, int channel_fd) {
    output_.limit = cap_for(STDOUT_FILENO, output_limit);
    error_.limit = cap_for(STDERR_FILENO, output_limit);
    output_.sink = STDOUT_FILENO;
    error_.sink = STDERR_FILENO;
    if (tty) {
        if (::isatty(STDIN_FILENO) != 1) throw Error("--tty: stdin is not a terminal");
        channel_ = channel_fd;
        active_ = true;
        return;
    }
    for (int fd = 0; fd < 3; ++fd) {
        const bool capped = fd != STDIN_FILENO && (fd == STDOUT_FILENO ? output_ : error_).limit;
        if (::isatty(fd) != 1 && !capped) continue;
        Pipe pipe = make_pipe("stdio relay");
        if (fd == STDIN_FILENO) {
            sandbox_ends_[fd] = std::move(pipe.read_end);
            input_.source = STDIN_FILENO;
            input_.owned_sink = std::move(pipe.write_end);
            input_.sink = input_.owned_sink.get();
            input_.sink_nonblocking = true;
            set_nonblocking(input_.sink, "a relay descriptor");
        } else {
            Channel& channel = fd == STDOUT_FILENO ? output_ : error_;
            sandbox_ends_[fd] = std::move(pipe.write_end);
            channel.owned_source = std::move(pipe.read_end);
            channel.source = channel.owned_source.get();
            channel.source_is_our_pipe = true;
        }
        active_ = true;
    }
}

UniqueFd StdioRelay::install_in_child() {
    UniqueFd diagnostics;
    if (sandbox_ends_[STDERR_FILENO]) diagnostics.reset(::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3));
    for (int fd = 0; fd < 3; ++fd) {
        if (!sandbox_ends_[fd]) continue;
        if (::dup2(sandbox_ends_[fd].get(), fd) < 0) throw system_error("dup2 for stdio relay");
        sandbox_ends_[fd].reset();
    }
    return diagnostics;
}

void StdioRelay::close_child_ends() {
    for (auto& end : sandbox_ends_) end.reset();
}

void StdioRelay::attach_terminal() {
    std::optional<FdMessage> message = receive_fd_message(channel_);
    channel_ = -1;
    if (!message || message->tag != MessageTag::kTerminal || message->fds.size() != 1) {
        return;  // the sandbox ended before its terminal existed
    }
    master_ = std::move(message->fds.front());
    set_nonblocking(master_.get(), "a relay descriptor");
    input_.source = STDIN_FILENO;
    input_.sink = master_.get();
    input_.sink_nonblocking = true;
    output_.owned_source.reset(::dup(master_.get()));  // polled apart from the writing side
    if (!output_.owned_source) throw system_error("--tty: dup");
    output_.source = output_.owned_source.get();
    copy_window_size(STDIN_FILENO, master_.get());
    raw_terminal_.emplace(STDIN_FILENO);
}

void StdioRelay::resize() {
    if (master_) copy_window_size(STDIN_FILENO, master_.get());
}

void StdioRelay::add_to_poll(std::vector<pollfd>& fds) const {
    if (channel_ >= 0) fds.push_back({channel_, POLLIN, 0});
    for (const Channel* channel : {&input_, &output_, &error_}) {
        if (!channel->buffer.empty() && channel->sink_alive) {
            fds.push_back({channel->sink, POLLOUT, 0});
        } else if (channel->reading()) {
            fds.push_back({channel->source, POLLIN, 0});
        }
    }
}

void StdioRelay::handle_poll(const std::vector<pollfd>& fds) {
    for (const pollfd& entry : fds) {
        if (entry.revents == 0) continue;
        if (channel_ >= 0 && entry.fd == channel_) {
            attach_terminal();
            continue;
        }
        for (Channel* channel : {&input_, &output_, &error_}) {
            if ((entry.events & POLLOUT) != 0 && entry.fd == channel->sink) {
                flush(*channel);
            } else if ((entry.events & POLLIN) != 0 && entry.fd == channel->source) {
                fill(*channel);
            }
        }
    }
}

void StdioRelay::fill(Channel& channel) {
    char buffer[kReadChunk];
    const ssize_t n = ::read(channel.source, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {  // EOF, or EIO from a terminal master once no process holds the other side
        channel.close_source();
        return;
    }
    auto allowed = static_cast<uint64_t>(n);
    if (channel.limit) {
        allowed = std::min(allowed, *channel.limit - std::min(*channel.limit, channel.passed));
        if (allowed < static_cast<uint64_t>(n)) channel.truncated = true;
    }
    channel.passed += allowed;
    if (channel.sink_alive) channel.buffer.append(buffer, allowed);
}

void StdioRelay::flush(Channel& channel) {
    // The caller's descriptors may be blocking: after POLLOUT a pipe takes PIPE_BUF bytes without
    // blocking, so no more than that goes to them at once. Our own ends are non-blocking.
    const size_t size = channel.sink_nonblocking
                            ? channel.buffer.size()
                            : std::min<size_t>(channel.buffer.size(), PIPE_BUF);
    const ssize_t n = ::write(channel.sink, channel.buffer.data(), size);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n < 0) {  // the reader is gone (EPIPE) or broken: drop this stream's data from now on
        channel.sink_alive = false;
        channel.buffer.clear();
        if (channel.source_is_our_pipe) channel.close_source();
        return;
    }
    channel.buffer.erase(0, static_cast<size_t>(n));
}

void StdioRelay::stop_input() {
    input_.close_source();
    input_.buffer.clear();
    input_.owned_sink.reset();
    input_.sink = -1;
}

void StdioRelay::abandon_output() {
    for (Channel* channel : {&output_, &error_}) {
        channel->close_source();
        channel->buffer.clear();
    }
}

bool StdioRelay::output_done() const {
    return output_.done() && error_.done();
}

}  // namespace sqbox

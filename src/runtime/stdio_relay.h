// The payload's stdio, when it cannot simply inherit the caller's: a terminal is never handed
// to the payload (it could inject input or change the caller's terminal settings), and
// --output-limit (on by default) needs sqbox to count what passes to a caller that is not a
// terminal: past the cap the relay reads on and discards, so the payload runs on undisturbed. Such
// streams become pipes that the launcher copies; the others are inherited unchanged (no copy, no
// cost). With --tty the payload gets a terminal of the sandbox's own (see terminal.h) and the relay
// copies between it and the caller's.
//
// The copying never blocks the launcher: each direction keeps a buffer, reads only when it is
// empty and writes only when poll() says the other side has room, so signals are always handled
// and a reader that stops reading holds back only its own stream.
#pragma once

#include <poll.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/terminal.h"
#include "util/unique_fd.h"

namespace sqbox {

class StdioRelay {
  public:
    // Decides which streams to relay and creates their pipes. With `tty`, the sandbox terminal's
    // master will arrive on `channel_fd` (the launcher's end of init's channel,
    // InitContext::channel); throws if `tty` but stdin is not a terminal.
    StdioRelay(std::optional<uint64_t> output_limit, bool tty, int channel_fd);
    StdioRelay(const StdioRelay&) = delete;
    StdioRelay& operator=(const StdioRelay&) = delete;

    [[nodiscard]] bool active() const { return active_; }

    // In the newly created child: puts the sandbox ends of the pipes on fds 0-2 and returns a
    // close-on-exec copy of the caller's stderr for sqbox's own messages (none if not needed).
    UniqueFd install_in_child();
    // In the launcher, once the child exists: drops the child's ends.
    void close_child_ends();
    // SIGWINCH: the caller's window changed size.
    void resize();

    // poll() set: appends the descriptors to watch, then handles what poll() reported for them.
    void add_to_poll(std::vector<pollfd>& fds) const;
    void handle_poll(const std::vector<pollfd>& fds);
    // Stops copying the caller's input (the payload is gone).
    void stop_input();
    // Drops output not yet delivered (the caller wants sqbox gone and is not reading).
    void abandon_output();
    // Every relayed output has reached EOF and been delivered (or dropped).
    [[nodiscard]] bool output_done() const;

    [[nodiscard]] bool stdout_truncated() const { return output_.truncated; }
    [[nodiscard]] bool stderr_truncated() const { return error_.truncated; }

  private:
    // One direction of copying: source -> buffer -> sink.
    struct Channel {
        int source = -1;
        UniqueFd owned_source;
        int sink = -1;
        UniqueFd owned_sink;
        std::string buffer;
        bool sink_nonblocking = false;  // our own end (else the caller's, maybe blocking)
        // false after a write error: the rest is dropped. A pipe of our own is then closed, so
        // the payload's writes fail (SIGPIPE, EPIPE) as they would on the caller's descriptor:
        // `sqbox run IMAGE yes | head -1` ends. A terminal's output is read on and dropped.
        bool sink_alive = true;
        bool source_is_our_pipe = false;
        std::optional<uint64_t> limit;
        uint64_t passed = 0;
        bool truncated = false;

        [[nodiscard]] bool reading() const { return source >= 0; }
        [[nodiscard]] bool done() const { return source < 0 && buffer.empty(); }
        void close_source();
    };

    static void fill(Channel& channel);
    static void flush(Channel& channel);
    void attach_terminal();

    bool active_ = false;
    Channel input_;   // the caller's stdin -> the sandbox
    Channel output_;  // the sandbox -> the caller's stdout (with --tty: the terminal's output)
    Channel error_;   // the sandbox -> the caller's stderr
    UniqueFd sandbox_ends_[3];  // the child's fds 0-2, where relayed
    int channel_ = -1;          // with --tty, until the master has arrived
    UniqueFd master_;           // the sandbox terminal's master, once received
    std::optional<RawTerminal> raw_terminal_;
};

}  // namespace sqbox

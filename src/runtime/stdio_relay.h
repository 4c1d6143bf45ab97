// The payload's stdio, when it cannot simply inherit the caller's: a terminal is never handed
// to the payload (it could inject input or change the caller's terminal settings), and
// --output-limit needs sqbox to count what passes. Such streams become pipes that the launcher
// copies; the others are inherited unchanged (no copy, no cost). With --tty the payload gets a
// terminal of the sandbox's own (see terminal.h) and the relay copies between it and the caller's.
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/terminal.h"
#include "util/unique_fd.h"

namespace sqbox {

class StdioRelay {
  public:
    // Decides which streams to relay and creates their pipes (or, with `tty`, the socket that
    // will bring the sandbox terminal's master). Throws if `tty` but stdin is not a terminal.
    StdioRelay(std::optional<uint64_t> output_limit, bool tty);
    StdioRelay(const StdioRelay&) = delete;
    StdioRelay& operator=(const StdioRelay&) = delete;

    [[nodiscard]] bool active() const;

    // In the newly created child: puts the sandbox ends of the pipes on fds 0-2 and returns a
    // close-on-exec copy of the caller's stderr for sqbox's own messages (-1 if not needed).
    int install_in_child();
    // In the launcher, once the child exists: drops the child's pipe ends.
    void close_child_ends();
    // With --tty: the socket init sends the terminal's master on (kept open in the child).
    [[nodiscard]] int child_tty_socket() const { return tty_socket_child_.get(); }
    // SIGWINCH: the caller's window changed size.
    void resize();

    // poll() set: appends the descriptors to watch, then handles what poll() reported for them.
    void add_to_poll(std::vector<pollfd>& fds) const;
    void handle_poll(const std::vector<pollfd>& fds);
    // Stops copying the caller's input (the payload is gone).
    void stop_input();

    [[nodiscard]] bool stdout_truncated() const { return streams_[1].truncated; }
    [[nodiscard]] bool stderr_truncated() const { return streams_[2].truncated; }

  private:
    struct Stream {
        bool relayed = false;
        UniqueFd sandbox_end;  // given to the child as fd 0, 1 or 2
        UniqueFd our_end;      // read (outputs) or written (stdin) by the launcher
        bool open = false;
        std::optional<uint64_t> limit;
        uint64_t passed = 0;
        bool truncated = false;
    };
    void copy_output(int fd_number);
    void copy_input();
    void attach_terminal();

    std::array<Stream, 3> streams_;
    bool tty_ = false;
    UniqueFd tty_socket_;        // our end: the master arrives here
    UniqueFd tty_socket_child_;  // the child's end
    UniqueFd master_;            // the sandbox terminal's master, once received
    std::optional<RawTerminal> raw_terminal_;
};

}  // namespace sqbox

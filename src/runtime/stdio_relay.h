// The payload's stdio, when it cannot simply inherit the caller's: a terminal is never handed
// to the payload (it could inject input or change the caller's terminal settings), and
// --output-limit needs sqbox to count what passes. Such streams become pipes that the launcher
// copies; the others are inherited unchanged (no copy, no cost).
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

class StdioRelay {
  public:
    // Decides which streams to relay and creates their pipes.
    explicit StdioRelay(std::optional<uint64_t> output_limit);
    StdioRelay(const StdioRelay&) = delete;
    StdioRelay& operator=(const StdioRelay&) = delete;

    [[nodiscard]] bool active() const;

    // In the newly created child: puts the sandbox ends of the pipes on fds 0-2 and returns a
    // close-on-exec copy of the caller's stderr for sqbox's own messages (-1 if not needed).
    int install_in_child();
    // In the launcher, once the child exists: drops the child's pipe ends.
    void close_child_ends();

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

    std::array<Stream, 3> streams_;
};

}  // namespace sqbox

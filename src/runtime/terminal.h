// --tty: a pseudo-terminal that belongs to the sandbox. Init opens it in the sandbox's own devpts
// and hands the controlling side (the master) to the launcher over a socket; the payload gets the
// other side as its controlling terminal and stdio. The caller's terminal itself is never handed
// to the payload: the launcher copies bytes between it and the master.
#pragma once

#include <termios.h>

#include "util/unique_fd.h"

namespace sqbox {

struct SandboxPty {
    UniqueFd master;
    UniqueFd slave;
};

// In init, after the pivot: a new pty from /dev/ptmx (the sandbox's devpts).
SandboxPty open_sandbox_pty();

// In the payload, after setsid(): makes `slave` the controlling terminal and fds 0-2.
void adopt_terminal(int slave);

// The caller's terminal in raw mode (every key goes to the sandbox, which has its own line
// discipline) for the lifetime of the object; the previous settings are restored on destruction.
class RawTerminal {
  public:
    explicit RawTerminal(int fd);
    ~RawTerminal();
    RawTerminal(const RawTerminal&) = delete;
    RawTerminal& operator=(const RawTerminal&) = delete;

  private:
    int fd_;
    bool changed_ = false;
    termios saved_{};
};

// Copies the window size of terminal `from` to terminal `to` (best effort).
void copy_window_size(int from, int to);

}  // namespace sqbox

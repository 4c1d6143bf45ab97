#include "runtime/terminal.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>

#include "util/errors.h"

namespace sqbox {

SandboxPty open_sandbox_pty() {
    SandboxPty pty;
    pty.master.reset(::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty.master) throw system_error("--tty: cannot open /dev/ptmx");
    int unlock = 0;
    if (::ioctl(pty.master.get(), TIOCSPTLCK, &unlock) != 0) throw system_error("--tty: unlockpt");
    // TIOCGPTPEER opens the peer through the master itself: no path lookup that could be raced.
    pty.slave.reset(::ioctl(pty.master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty.slave) throw system_error("--tty: cannot open the terminal's slave side");
    return pty;
}

void adopt_terminal(int slave) {
    if (::ioctl(slave, TIOCSCTTY, 0) != 0) throw system_error("--tty: TIOCSCTTY");
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(slave, fd) < 0) throw system_error("--tty: dup2");
    }
}

RawTerminal::RawTerminal(int fd) : fd_(fd) {
    if (::tcgetattr(fd, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    changed_ = ::tcsetattr(fd, TCSANOW, &raw) == 0;
}

RawTerminal::~RawTerminal() {
    if (changed_) (void)::tcsetattr(fd_, TCSANOW, &saved_);
}

void copy_window_size(int from, int to) {
    winsize size{};
    if (::ioctl(from, TIOCGWINSZ, &size) == 0) (void)::ioctl(to, TIOCSWINSZ, &size);
}

}  // namespace sqbox

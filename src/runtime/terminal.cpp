#include "runtime/terminal.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
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

namespace {

// One byte of data carrying one descriptor (SCM_RIGHTS), as sendmsg/recvmsg want it.
struct FdMessage {
    char byte = 't';
    iovec data{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};

    FdMessage() {
        message.msg_iov = &data;
        message.msg_iovlen = 1;
        message.msg_control = control;
        message.msg_controllen = sizeof control;
    }
    FdMessage(const FdMessage&) = delete;
    FdMessage& operator=(const FdMessage&) = delete;
};

}  // namespace

void send_fd(int socket_fd, int fd) {
    FdMessage packet;
    cmsghdr* header = CMSG_FIRSTHDR(&packet.message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
    if (::sendmsg(socket_fd, &packet.message, MSG_NOSIGNAL) != 1) {
        throw system_error("--tty: cannot pass the terminal to sqbox");
    }
}

UniqueFd receive_fd(int socket_fd) {
    FdMessage packet;
    if (::recvmsg(socket_fd, &packet.message, MSG_CMSG_CLOEXEC) <= 0) return UniqueFd();
    cmsghdr* header = CMSG_FIRSTHDR(&packet.message);
    if (header == nullptr || header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS ||
        header->cmsg_len != CMSG_LEN(sizeof(int))) {
        return UniqueFd();
    }
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(header), sizeof fd);
    return UniqueFd(fd);
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

#include "runtime/image_mount_probe.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "runtime/rootfs.h"

namespace sqbox {

bool ImageMountProbe::start() {
    // glibc's fork, not a raw clone: the caller may have threads (the look-ahead), and the child
    // calls nothing but statfs.
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
        (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
        // Nothing of the caller's kept open past it (the shared server's connection, say).
        (void)::syscall(SYS_close_range, 0U, ~0U, 0U);
        struct statfs fs {};
        (void)::statfs(kImageDir, &fs);
        ::_exit(0);
    }
    child_ = ChildProcess(pid);
    exit_ = open_pidfd(pid);
    if (!exit_) {
        // No way to wait for it: gone at once (a stalled server never takes its request, a live
        // one answers it).
        child_.kill_and_reap();
        return false;
    }
    return true;
}

bool ImageMountProbe::answered() {
    return !child_.running() || child_.try_reap().has_value();
}

bool end_image_server_if_stalled(const std::function<void()>& end_server) {
    ImageMountProbe probe;
    if (!probe.start()) return false;
    pollfd exited{probe.exit_fd(), POLLIN, 0};
    const auto wait_ms = std::chrono::milliseconds(kStalledServerVerdict).count();
    int ready = 0;
    do {
        ready = ::poll(&exited, 1, static_cast<int>(wait_ms));
    } while (ready < 0 && errno == EINTR);
    if (ready != 0) return false;  // answered (or no verdict to be had)
    end_server();
    probe.stop();
    return true;
}

}  // namespace sqbox

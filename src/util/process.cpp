#include "util/process.h"

#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <string>

#include "util/errors.h"

namespace sqbox {

pid_t clone_process(unsigned long namespace_flags, const char* purpose) {
    // Raw syscall: glibc's clone() wants a separate stack, and fork() cannot create a pid
    // namespace whose pid 1 is the child itself. Argument order is x86_64/aarch64's.
    long pid = ::syscall(SYS_clone, namespace_flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
    if (pid < 0) {
        const int err = errno;
        throw Error(std::string("cannot create ") + purpose + ": " + std::strerror(err), err);
    }
    return static_cast<pid_t>(pid);
}

void close_fds_except(std::vector<int> keep) {
    keep.push_back(STDERR_FILENO);
    std::sort(keep.begin(), keep.end());
    unsigned first = STDERR_FILENO + 1;
    for (int fd : keep) {
        if (fd < static_cast<int>(first)) continue;
        if (static_cast<unsigned>(fd) > first) {
            (void)::syscall(SYS_close_range, first, static_cast<unsigned>(fd) - 1, 0U);
        }
        first = static_cast<unsigned>(fd) + 1;
    }
    (void)::syscall(SYS_close_range, first, ~0U, 0U);
}

void die_with_parent(pid_t expected_parent) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw system_error("prctl(PR_SET_PDEATHSIG)");
    if (::getppid() != expected_parent) ::_exit(kExitSqboxFailure);
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
    if (this != &other) {
        kill_and_reap();
        pid_ = other.pid_;
        other.pid_ = -1;
    }
    return *this;
}

std::optional<int> ChildProcess::try_reap() {
    if (pid_ <= 0) return std::nullopt;
    int status = 0;
    pid_t r;
    do {
        r = ::waitpid(pid_, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) {
        pid_ = -1;
        return status;
    }
    return std::nullopt;
}

int ChildProcess::wait() {
    if (pid_ <= 0) throw Error("waiting for a child that is not there");
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
        if (errno != EINTR) throw system_error("waitpid");
    }
    pid_ = -1;
    return status;
}

void ChildProcess::kill_and_reap() {
    if (pid_ <= 0) return;
    (void)::kill(pid_, SIGKILL);  // ESRCH only if it already exited; reaped below either way
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
}

void ChildProcess::send(int signal) const {
    if (pid_ > 0) (void)::kill(pid_, signal);  // the child may be exiting: nothing to do then
}

UniqueFd open_pidfd(pid_t pid) {
    return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

int shell_status(int wait_status) {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) return kExitSignalBase + WTERMSIG(wait_status);
    return kExitSqboxFailure;
}

}  // namespace sqbox

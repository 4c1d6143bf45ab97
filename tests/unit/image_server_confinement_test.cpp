// The image server's seccomp allow-list: what serving needs passes, anything else kills the whole
// process (not only the thread that made the call), so a hijacked server dies at once.
#include "runtime/image_server_confinement.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <functional>
#include <thread>

namespace sqbox {
namespace {

// Runs `body` in a child under the filter; returns the child's wait status.
int status_under_filter(const std::function<void()>& body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(90);
        try {
            install_image_server_filter();
        } catch (...) {
            ::_exit(91);
        }
        body();
        ::_exit(0);
    }
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
}

bool killed_by_seccomp(int status) {
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS;
}

TEST(ImageServerFilter, ServingCallsPass) {
    const int status = status_under_filter([] {
        int pipe_fds[2];
        if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) ::_exit(1);
        if (::write(pipe_fds[1], "x", 1) != 1) ::_exit(2);
        char byte = 0;
        if (::read(pipe_fds[0], &byte, 1) != 1) ::_exit(3);
        if (::fcntl(pipe_fds[0], F_SETPIPE_SZ, 1 << 16) < 0) ::_exit(4);
        // A thread, as the read-ahead thread is started (clone3 refused, clone with CLONE_THREAD).
        std::thread([] {}).join();
        void* mapped =
            ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED || ::munmap(mapped, 1 << 20) != 0) ::_exit(6);
        void* memory = ::malloc(64 << 20);
        if (memory == nullptr) ::_exit(5);
        ::free(memory);
        (void)::close(pipe_fds[0]);
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ImageServerFilter, AnythingElseKillsTheProcess) {
    EXPECT_TRUE(
        killed_by_seccomp(status_under_filter([] { (void)::socket(AF_UNIX, SOCK_STREAM, 0); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::fork(); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::dup(0); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::fcntl(0, F_DUPFD, 10); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::ioctl(0, 0); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::kill(::getppid(), 0); })));
    EXPECT_TRUE(killed_by_seccomp(
        status_under_filter([] { (void)::syscall(SYS_tgkill, ::getppid(), ::getppid(), 0); })));
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] { (void)::unshare(0); })));
    // Shared memory is not counted by RLIMIT_DATA: a hijacked server may not map any.
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] {
        (void)::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    })));
    // From a second thread: the whole process goes, not only the thread.
    EXPECT_TRUE(killed_by_seccomp(status_under_filter([] {
        std::thread([] { (void)::socket(AF_INET, SOCK_STREAM, 0); }).join();
        ::_exit(0);
    })));
}

}  // namespace
}  // namespace sqbox

// Process creation and ownership for the launch pipeline.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

// clone(2) without a new stack (fork-like, no CLONE_VM) so that namespace flags such as
// CLONE_NEWPID apply to the child itself. Only safe in a single-threaded process. Returns the
// child's pid in the parent and 0 in the child; throws Error on failure.
// Refusals give strerror only: runtime/user_namespace.h's clone_into_user_namespace says why.
pid_t clone_process(unsigned long namespace_flags, const char* purpose);

// Makes the calling process receive SIGKILL when its parent dies, and exits at once if the parent
// is already gone (the race between fork and prctl).
void die_with_parent(pid_t expected_parent);

// A child process this process must not outlive: killed and reaped on destruction unless it was
// already waited for.
class ChildProcess {
  public:
    ChildProcess() = default;
    explicit ChildProcess(pid_t pid) : pid_(pid) {}
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
    ChildProcess& operator=(ChildProcess&& other) noexcept;
    ~ChildProcess() { kill_and_reap(); }

    [[nodiscard]] pid_t pid() const { return pid_; }
    [[nodiscard]] bool running() const { return pid_ > 0; }

    // Non-blocking: returns the wait status if the child has exited (and forgets it).
    std::optional<int> try_reap();
    // Blocks until the child exits; returns its wait status (and forgets it).
    int wait();
    // SIGKILL, then wait. No-op if already reaped.
    void kill_and_reap();
    // Sends `signal` if the child is still ours.
    void send(int signal) const;

  private:
    pid_t pid_ = -1;
};

// Closes every descriptor except `keep` and stdio: nothing the caller leaked into sqbox (or a
// long-lived sqbox process holds for other sandboxes) stays open in a sandbox's processes.
void close_fds_except(std::vector<int> keep);

// A pidfd of `pid` (readable once the process has exited), or none with errno set.
UniqueFd open_pidfd(pid_t pid);

// Exit status as a shell reports it: the code, or 128+N for death by signal N.
int shell_status(int wait_status);

}  // namespace sqbox

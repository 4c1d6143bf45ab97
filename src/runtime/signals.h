// Signals in the pipeline: every sqbox process keeps the forwarded signals (and SIGCHLD) blocked
// and collects them synchronously with sigwaitinfo, so no handler ever runs concurrently with
// setup.
#pragma once

#include <csignal>
#include <optional>

namespace sqbox {

// SIGINT, SIGTERM, SIGHUP, SIGQUIT: passed from sqbox down to the payload.
bool is_forwarded_signal(int sig);

// The forwarded signals.
sigset_t forwarded_signals();

// The forwarded signals plus SIGCHLD.
sigset_t pipeline_signals();

// Blocks pipeline_signals() for its lifetime (children inherit the block), restoring the previous
// mask on destruction.
class ScopedSignalBlock {
  public:
    ScopedSignalBlock();
    ~ScopedSignalBlock();
    ScopedSignalBlock(const ScopedSignalBlock&) = delete;
    ScopedSignalBlock& operator=(const ScopedSignalBlock&) = delete;

  private:
    sigset_t previous_{};
};

// The first forwarded signal pending for this process (blocked, not yet taken), if any.
std::optional<int> pending_forwarded_signal() noexcept;

// Waits for one of pipeline_signals() (and `also`, if not 0, blocked by the caller); with a
// timeout in milliseconds, returns nullopt when it expires. EINTR is retried.
std::optional<siginfo_t> wait_for_signal(std::optional<long> timeout_ms, int also = 0);

// The forwarded signals ignored from now on, and any pending one dropped: for a launcher whose
// sandbox is gone and which only has its result left to give.
void ignore_forwarded_signals();

// Every handler back to the default and nothing blocked: for a process that leaves the pipeline
// (the payload, the shared image server), whose signals are its own. Throws Error.
void reset_signal_handling();

}  // namespace sqbox

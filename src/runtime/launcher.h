// The launcher's steps: the caller's own process, which holds the caller's view of the host (the
// image, /dev/fuse, the sandbox's cgroup). runtime/pipeline.cpp calls them in order.
#pragma once

#include <csignal>
#include <functional>
#include <optional>
#include <string>

#include "runtime/cgroups.h"
#include "runtime/sandbox_plan.h"
#include "runtime/stage_report.h"
#include "runtime/stdio_relay.h"
#include "sqbox/config.h"
#include "sqbox/result.h"
#include "util/process.h"

namespace sqbox {

// The sandbox's cgroup when it must be decided before the sandbox starts (an explicit --cgroup,
// --cpus, --verbose); nullopt otherwise, and hand_over_cgroup decides it while the sandbox is
// being set up.
std::optional<SandboxCgroup> plan_cgroup_before_start(const SandboxConfig& config);

// The run's plan (build_sandbox_plan) plus the launcher's own checks of options that need to know
// the cgroup; with --verbose, says which mechanism holds each layer and limit.
SandboxPlan plan_run(const SandboxConfig& config, const SandboxCgroup* cgroup);

// Decides (unless decided first) and creates the sandbox's cgroup while the supervisor and init
// set the sandbox up, and sends init the files that move it in, with the limits it holds. A
// failure goes to init as text: init reports it (one line, 125).
void hand_over_cgroup(const SandboxConfig& config, std::optional<SandboxCgroup>& cgroup,
                      int channel);

// Restores SIGPIPE's disposition on scope exit; while relaying, a payload that closes its stdin
// must give the launcher EPIPE, not kill it.
class ScopedIgnoreSigpipe {
  public:
    ScopedIgnoreSigpipe();
    ~ScopedIgnoreSigpipe();
    ScopedIgnoreSigpipe(const ScopedIgnoreSigpipe&) = delete;
    ScopedIgnoreSigpipe& operator=(const ScopedIgnoreSigpipe&) = delete;

  private:
    struct sigaction previous_ {};
};

// What supervise() saw: the supervisor's wait status and, if it sent one, its final report.
struct Supervision {
    int status = 0;
    std::optional<StageReport> report;
};

// Forwards signals to the supervisor and relays stdio until the supervisor has exited and all
// relayed output is drained. The supervisor reports once init is gone, before it tears down its
// own mounts: `sandbox_gone` runs then, so that work overlaps with that teardown.
Supervision supervise(ChildProcess& supervisor, StdioRelay& relay, int report_fd,
                      const std::function<void()>& sandbox_gone);

// The caller's record of a finished sandbox. Throws Error if the supervisor died without a report.
RunResult result_of(const Supervision& supervision, const StdioRelay& relay,
                    const SandboxConfig& config, const SandboxPlan& plan,
                    const SandboxCgroup* cgroup, bool oom_killed);

// The caller's record of a launch that a forwarded signal stopped before the sandbox existed:
// nothing ran, and sqbox ends as if the signal had ended the command (128 + its number). Prints
// the one line that says so.
RunResult stopped_before_start(const SandboxConfig& config, int signal);

}  // namespace sqbox

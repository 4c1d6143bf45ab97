// PID 1 of the sandbox.
#pragma once

#include "runtime/sandbox_plan.h"

namespace sqbox {

struct InitContext {
    const SandboxPlan* plan = nullptr;
    int report_fd = -1;    // StageReport to the supervisor
    int lifeline_fd = -1;  // read end of a pipe the supervisor holds open: EOF = supervisor gone
};

// Runs as the first process of fresh pid, mount, network, ipc, uts and cgroup namespaces: sets the
// hostname, brings up loopback, assembles the root and pivots into it, then starts the payload,
// forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, reaps every orphan, and reports how the payload
// ended. Its exit takes every remaining process of the sandbox with it.
[[noreturn]] void run_init(const InitContext& context);

}  // namespace sqbox

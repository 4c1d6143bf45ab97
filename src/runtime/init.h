// PID 1 of the sandbox.
#pragma once

#include "runtime/sandbox_plan.h"

namespace sqbox {

struct InitContext {
    const SandboxPlan* plan = nullptr;
    int report_fd = -1;    // StageReport to the supervisor
    int lifeline_fd = -1;  // read end of a pipe the supervisor holds open: EOF = supervisor gone
    // sqbox run: init is started before the image is mounted, in the supervisor's mount namespace;
    // one byte here says the image is ready, and init takes its own copy of the mount namespace.
    // -1: init was cloned into its own mount namespace with the image already there.
    int image_ready_fd = -1;
};

// Runs as the first process of fresh pid, mount, network, ipc, uts and cgroup namespaces: creates
// the network namespace with loopback up, sets the hostname, assembles the root and pivots into it,
// then starts the payload, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, reaps every orphan, and
// reports how the payload ended. Its exit takes every remaining process of the sandbox with it.
[[noreturn]] void run_init(const InitContext& context);

}  // namespace sqbox

// The sandbox's supervisor: root of a new user namespace, owner of the image mount.
#pragma once

#include <sys/types.h>

#include "image/image_source.h"
#include "runtime/sandbox_plan.h"

namespace sqbox {

struct SupervisorContext {
    const SandboxPlan* plan = nullptr;
    const ImageSource* image = nullptr;
    int report_fd = -1;  // StageReport to the launcher
    pid_t launcher_pid = 0;
};

// Runs in a fresh user + mount namespace: maps the caller's ids, builds the scratch root, mounts
// the image (starting the FUSE server), starts init in the sandbox's namespaces, enforces the
// wall-clock timeout, forwards the launcher's signals to init, and reports the outcome. Kills the
// FUSE server before exiting; dies with the launcher.
[[noreturn]] void run_supervisor(const SupervisorContext& context);

}  // namespace sqbox

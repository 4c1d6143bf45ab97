// The sandbox's supervisor: root of a new user namespace, owner of the image mount.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "image/image_source.h"
#include "runtime/sandbox_plan.h"
#include "runtime/user_namespace.h"
#include "util/process.h"
#include "warm_up/warm_up.h"

namespace sqbox {

// The namespaces init is cloned into. Init creates the others itself: the network namespace first
// thing (see enter_loopback_only_network), the cgroup namespace once it is in the sandbox's cgroup.
inline constexpr unsigned long kSandboxNamespaces =
    CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS;

// Both supervisors (`sqbox run`'s and `sqbox serve`'s), first thing in their new user namespace:
// maps the caller's ids as `config` asks, then stops being dumpable.
IdMapping map_ids_and_seal(const SandboxConfig& config);

// Both supervisors: moves to the private scratch root, mounts `image` at /image and, for a
// squashfs image, forks the FUSE server that serves it (closing `close_in_server` there).
// Returns the server; no process for a directory image. `learn_fd`: where the server records
// a learning run's lookups and reads (-1: not learning).
ChildProcess mount_image_and_serve(const ImageSource& image, const IdMapping& ids,
                                   const std::vector<int>& close_in_server, int learn_fd = -1);

struct SupervisorContext {
    const SandboxPlan* plan = nullptr;
    const ImageSource* image = nullptr;
    int report_fd = -1;  // StageReport to the launcher
    pid_t launcher_pid = 0;
    // The image's learned warm-up list, looked up ahead of the payload (not in the plan: init and
    // the payload have no use for it).
    const std::vector<WarmUpName>* warm_up_names = nullptr;
};

// Runs in a fresh user + mount namespace: maps the caller's ids, builds the scratch root, mounts
// the image (starting the FUSE server), starts init in the sandbox's namespaces, enforces the
// wall-clock timeout, forwards the launcher's signals to init, and reports the outcome. Kills the
// FUSE server before exiting; dies with the launcher.
[[noreturn]] void run_supervisor(const SupervisorContext& context);

}  // namespace sqbox

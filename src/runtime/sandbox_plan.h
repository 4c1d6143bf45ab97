// Everything the launcher decides before the sandbox exists: the caller's configuration plus what
// was derived from it (the compiled seccomp filter, the Landlock ABI, where each limit goes). Built
// once, then only read by the supervisor, init and the payload (they get copies via fork). It holds
// no descriptor: each process's own are in its context (SupervisorContext, InitContext,
// PayloadContext), which owns them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "security/seccomp_filter.h"
#include "sqbox/config.h"

namespace sqbox {

struct SandboxPlan {
    const SandboxConfig* config = nullptr;
    std::optional<SeccompFilter> seccomp;  // nullopt: --seccomp none
    int landlock_abi = 0;                  // 0: Landlock unavailable, not applied
    // The profile is one of sqbox's own (or none), which allow every call the payload makes once
    // its filter is in place: the payload installs the filter before the root is ready, and in a
    // plain run (not pooled, no --tty) init starts it while it still builds the root, so that the
    // payload's own set-up overlaps with that. A profile from a file goes in last.
    bool seccomp_before_root_ready = false;
    ResourceLimits rlimits;  // what the payload applies with setrlimit(2)
    // A sandbox set up ahead of its request (sqbox serve --pool): once its root is ready, init
    // waits on its channel for the command, environment additions and stdio, then starts it.
    bool pooled = false;
    // sqbox serve: init is in a user namespace of its own below the server's, so per-user counts
    // (RLIMIT_NPROC) are per sandbox and one sandbox's fork bomb cannot starve the others. Init
    // maps these ids to themselves (they are the server's view of the caller).
    std::optional<std::pair<uid_t, gid_t>> own_user_namespace;
};

// The one policy builder, for `sqbox run`'s launcher and for `sqbox serve` (its template for every
// sandbox): the seccomp filter compiled from config.seccomp_profile, the kernel's Landlock ABI,
// whether the payload may start before its root is ready, and the rlimits (init drops the ones
// the sandbox's cgroup holds when it joins). Throws Error for a profile that cannot be used.
SandboxPlan build_sandbox_plan(const SandboxConfig& config);

// `plan` made the plan of serve's zygote (SandboxConfig::zygote): its own filter
// (security/zygote_seccomp.h), installed last, and no Landlock, which would forbid the mounts each
// request's sandbox takes (each child applies Landlock itself once they are made).
void make_zygote_plan(SandboxPlan& plan, const SeccompFilter& zygote_filter);

}  // namespace sqbox

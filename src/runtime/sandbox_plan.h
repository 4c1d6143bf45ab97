// Everything the launcher decides before the sandbox exists: the caller's configuration plus what
// was derived from it (the compiled seccomp filter, the Landlock ABI, where each limit goes). Built
// once, then only read by the supervisor, init and the payload (they get copies via fork).
#pragma once

#include <array>
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
    ResourceLimits rlimits;   // what the payload applies with setrlimit(2)
    int diagnostics_fd = -1;  // where sqbox's own messages go (stderr when -1)
    // The payload's stdin, stdout and stderr when they are not the process's own 0-2 (sqbox
    // serve starts sandboxes from a long-lived process): init moves them to 0-2 and closes every
    // other descriptor it did not get from this plan.
    std::array<int, 3> stdio_fds = {-1, -1, -1};
    // A sandbox set up ahead of its request (sqbox serve --pool): once its root is ready, init
    // waits on channel_fd for the command, environment additions and stdio ('g'), then starts it.
    bool pooled = false;
    // sqbox serve: init is in a user namespace of its own below the server's, so per-user counts
    // (RLIMIT_NPROC) are per sandbox and one sandbox's fork bomb cannot starve the others. Init
    // maps these ids to themselves (they are the server's view of the caller).
    std::optional<std::pair<uid_t, gid_t>> own_user_namespace;
    // Init's end of a SOCK_SEQPACKET channel to the launcher: init first receives the files that
    // move it into the sandbox's cgroup ('c', or 'e' with an error), then with --tty sends the
    // terminal's master ('t').
    int channel_fd = -1;
    // A learning run: the memory file the image server appends its records to; -1 otherwise.
    int learn_fd = -1;
    // The image's unpacked files (warm_up/unpacked_files.h): the directory on the host, and an
    // O_PATH descriptor of it taken when its stamp was checked, which the supervisor's bind must
    // match (another run may replace the directory meanwhile). Empty and -1 if there are none.
    std::string unpacked_files_tree;
    int unpacked_files_fd = -1;
};

// The one policy builder, for `sqbox run`'s launcher and for `sqbox serve` (its template for every
// sandbox): the seccomp filter compiled from config.seccomp_profile, the kernel's Landlock ABI,
// whether the payload may start before its root is ready, and the rlimits (init drops the ones
// the sandbox's cgroup holds when it joins). Throws Error for a profile that cannot be used.
SandboxPlan build_sandbox_plan(const SandboxConfig& config);

}  // namespace sqbox

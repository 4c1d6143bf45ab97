// Everything the launcher decides before the sandbox exists: the caller's configuration plus what
// was derived from it (the compiled seccomp filter, the Landlock ABI, where each limit goes). Built
// once, then only read by the supervisor, init and the payload (they get copies via fork).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "security/seccomp_filter.h"
#include "sqbox/config.h"

namespace sqbox {

struct SandboxPlan {
    const SandboxConfig* config = nullptr;
    std::optional<SeccompFilter> seccomp;  // nullopt: --seccomp none
    int landlock_abi = 0;                  // 0: Landlock unavailable, not applied
    ResourceLimits rlimits;                // what the payload applies with setrlimit(2)
    std::vector<int> cgroup_join_fds;      // init moves itself into the sandbox's cgroup(s)
    int diagnostics_fd = -1;               // where sqbox's own messages go (stderr when -1)
    int tty_socket_fd = -1;                // --tty: init sends the terminal's master here
};

}  // namespace sqbox

// The long-lived supervisor of `sqbox serve`: one user namespace, one scratch root and one FUSE
// server for the image, under which every requested sandbox is a new init (fresh pid, mount,
// network, ipc, uts and cgroup namespaces, a fresh writable layer). The image's page cache stays
// warm from one sandbox to the next, and a sandbox costs a clone and a few mounts.
//
// It talks to the server over a SOCK_SEQPACKET socket:
//   server -> supervisor  's' start {key} + fds [request memfd {config, rlimits, pooled},
//                             stdin, stdout, stderr (not for a pooled sandbox), cgroup...]
//                         'g' go {key, command, environment, workdir, cpu_seconds, timeout}
//                             + fds [stdin, stdout, stderr]: a pooled sandbox's request
//                         'k' signal {key, signal} (SIGKILL ends the sandbox)
//                         'd' deadline {key, timeout}: a pre-started sandbox's request came, its
//                             timeout counts from now
//   supervisor -> server  'w' ready (the image is mounted) or 'e' {error} at start-up
//                         'r' {key, report...} when a sandbox has ended
#pragma once

#include <string>

#include <optional>
#include "image/image_source.h"

#include "runtime/sandbox_plan.h"
#include "sqbox/config.h"

namespace sqbox {

// Where the session driver is, inside every sandbox that asks for it.
inline constexpr const char* kDriverPathInSandbox = "/run/sqbox/driver.py";
// ...and in the supervisor's scratch root, where sandboxes bind it from.
inline constexpr const char* kDriverPathInScratch = "/session/driver.py";

struct WarmSupervisorContext {
    const ImageSource* image = nullptr;
    const SandboxConfig* base = nullptr;  // ids and the image; per-request configs arrive later
    SandboxPlan plan_template;            // seccomp filter and Landlock ABI for every sandbox
    std::optional<SeccompFilter> zygote_seccomp;  // --zygote: the zygote sandbox's own filter
    std::string driver_source;
    int control_fd = -1;
    pid_t server_pid = 0;
};

[[noreturn]] void run_warm_supervisor(const WarmSupervisorContext& context);

}  // namespace sqbox

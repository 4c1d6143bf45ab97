// The plain-data description of one sandbox run. Built once by a front end (the CLI, later the
// server), validated there, and only read by every step of the launch pipeline.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sqbox {

inline constexpr uint64_t kMiB = 1024ULL * 1024ULL;
inline constexpr uint64_t kGiB = 1024ULL * kMiB;

struct BindMount {
    std::string source;       // absolute, symlink-free host path (the front end canonicalises it)
    std::string destination;  // absolute path inside the sandbox
    bool read_only = false;
};

// Resource limits of one sandbox. Every run has the defaults below (documented in SECURITY.md:
// they keep a 2-core, 24 GiB machine responsive); nullopt means unlimited. Memory, processes
// and CPU share go to a cgroup when sqbox has one (see cgroup_parent), otherwise to rlimits.
struct ResourceLimits {
    std::optional<uint64_t> memory_bytes = 4 * kGiB;     // --memory
    std::optional<uint64_t> processes = 512;             // --pids
    std::optional<uint64_t> cpu_seconds;                 // --cpu-time (RLIMIT_CPU)
    std::optional<uint64_t> file_size_bytes = 1 * kGiB;  // --fsize (RLIMIT_FSIZE)
    std::optional<uint64_t> open_files = 4096;           // --nofile (RLIMIT_NOFILE)
    std::optional<double> cpus;                          // --cpus (cgroup cpu.max only)
};

struct SandboxConfig {
    std::string image;                 // a .sqsh file or a root filesystem directory
    std::vector<std::string> command;  // argv of the payload; never empty
    std::vector<BindMount> mounts;
    // Variables set on top of the image's /etc/environment, in order (later wins).
    std::vector<std::pair<std::string, std::string>> environment;
    std::string workdir = "/";
    std::string hostname = "sandbox";

    bool map_root = false;        // caller appears as uid/gid 0 inside (enroot --root)
    bool read_only_root = false;  // no overlay: read-only root with a writable /tmp
    uint64_t tmpfs_size_bytes =
        kGiB;  // cap of each writable tmpfs (root upper layer, /tmp, /dev/shm)

    std::optional<double> timeout_seconds;
    ResourceLimits limits;
    // A delegated cgroup v2 directory to create the sandbox's cgroup in; empty: find one (see
    // runtime/cgroups.h).
    std::string cgroup_parent;

    // "default", "strict" (built in), "none", or the path of a profile in Docker's JSON format.
    std::string seccomp_profile = "default";

    // Cap on the bytes of stdout and of stderr that reach the caller; the rest is discarded.
    std::optional<uint64_t> output_limit_bytes;
    // Give the payload a terminal of the sandbox's own (the caller's stdin must be a terminal).
    bool tty = false;

    // Identity of the caller outside, mapped into the sandbox's user namespace.
    uid_t outside_uid = 0;
    gid_t outside_gid = 0;

    bool verbose = false;
};

}  // namespace sqbox

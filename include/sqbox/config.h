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

// Per-process resource limits applied with setrlimit(2) just before the payload is executed.
struct ResourceLimits {
    std::optional<uint64_t> address_space_bytes;  // --memory
    std::optional<uint64_t> cpu_seconds;          // --cpu-time
    std::optional<uint64_t> processes;            // --pids
    std::optional<uint64_t> file_size_bytes;      // --fsize
    std::optional<uint64_t> open_files;           // --nofile
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

    // Identity of the caller outside, mapped into the sandbox's user namespace.
    uid_t outside_uid = 0;
    gid_t outside_gid = 0;

    bool verbose = false;
};

}  // namespace sqbox

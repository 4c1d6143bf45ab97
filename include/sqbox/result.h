// What a finished sandbox run reports back to its caller.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sqbox {

// One resource limit of the run and what enforced it.
struct AppliedLimit {
    std::string name;             // "memory", "pids", "cpu_time", "file_size", "open_files", "cpus"
    std::optional<double> value;  // bytes, processes, seconds, CPUs; nullopt = unlimited
    std::string enforced_by;      // "cgroup-v2", "cgroup-v1", "rlimit", or "none"
};

struct RunResult {
    int exit_status = 0;                   // what the sqbox process exits with (see docs/run.md)
    std::optional<int> payload_exit_code;  // set when the payload exited normally
    std::optional<int> signal;             // set when the payload was killed by a signal
    bool timed_out = false;
    bool payload_started = false;
    double wall_ms = 0;             // wall-clock time of the payload
    double cpu_ms = 0;              // user + system CPU time of the payload and its reaped children
    uint64_t peak_rss_bytes = 0;    // largest resident set of the payload or any reaped descendant
    bool oom_killed = false;        // the kernel's OOM killer hit the sandbox's memory limit
    bool stdout_truncated = false;  // --output-limit discarded part of stdout
    bool stderr_truncated = false;  // ... of stderr
    std::vector<AppliedLimit> limits;
    std::string seccomp;   // profile in force ("default", "strict", a path, "none")
    int landlock_abi = 0;  // Landlock ABI applied, 0 when not applied
    // How the payload's root reads the image: "fuse" (the image server), "unpacked" (a .sqsh
    // unpacked into the cache where /dev/fuse is not usable), "directory"; empty if not decided.
    std::string image_access;
    std::string proc;   // "fresh" or "outer" (--proc)
    std::string error;  // sqbox's own failure, empty when none
};

}  // namespace sqbox

// The sandbox's own cgroup: where sqbox can get one, memory, process count and CPU share are
// limited for the whole sandbox (not per process, as rlimits are), and an out-of-memory kill can
// be told apart from other deaths.
//
// Where the cgroup comes from:
//  - --cgroup DIR: a cgroup v2 directory delegated to the caller (writable, no processes of its
//    own, e.g. made by `systemd-run --user -p Delegate=yes`); sqbox creates DIR/sqbox-<pid>-<n>.
//  - run as root without --cgroup: <cgroup2 mount>/sqbox/sqbox-<pid>-<n> if the v2 hierarchy has
//    the memory and pids controllers, else a child of root's own cgroup in each cgroup v1
//    hierarchy (memory, pids, cpu) that is mounted.
//  - otherwise none, and the limits fall back to rlimits.
// The launcher creates it and opens the files that move a process in; init moves itself in
// through them before starting the payload (the supervisor and the image server stay outside, so
// the OOM killer can only pick sandbox processes); the launcher removes it when the sandbox is
// gone.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

class SandboxCgroup {
  public:
    // Decides where the sandbox's cgroup goes and checks that it can (cheap: no cgroup is made
    // yet); nullopt when no cgroup is available (see above). Throws when --cgroup was given but
    // cannot be used.
    static std::optional<SandboxCgroup> plan(const SandboxConfig& config);
    // Creates the cgroup directories, writes the limits and opens the join files. The launcher
    // does this while the sandbox is being set up (creating a memory cgroup costs about a
    // millisecond); init waits for the join files before it starts the payload.
    void create();

    SandboxCgroup(SandboxCgroup&&) noexcept = default;
    SandboxCgroup& operator=(SandboxCgroup&&) noexcept = default;
    ~SandboxCgroup();

    // "cgroup-v2" or "cgroup-v1", for reports.
    [[nodiscard]] const std::string& mechanism() const { return mechanism_; }
    [[nodiscard]] bool limits_memory() const { return limits_.memory_bytes.has_value(); }
    [[nodiscard]] bool limits_processes() const { return limits_.processes.has_value(); }
    [[nodiscard]] bool limits_cpu() const { return cpu_; }
    // Writing "0" to each of these moves the calling (single-threaded) process in. In v1 they
    // are "tasks" files: moving one thread that way skips the global lock whose RCU grace period
    // (~10 ms) a whole-process move through cgroup.procs waits for.
    [[nodiscard]] std::vector<int> join_fds() const;
    // Whether the kernel's OOM killer killed a process of this cgroup.
    [[nodiscard]] bool oom_killed() const;
    // Removes the cgroup (also done on destruction). Call only once the sandbox's processes are
    // gone; a cgroup still in use is retried for a moment, then left to the next sqbox run.
    void remove() noexcept;

  private:
    struct Directory {
        std::string parent;
        std::string controller;  // "v2", or the v1 controller: "memory", "pids", "cpu"
        std::string path;        // set by create()
        UniqueFd join;
    };
    SandboxCgroup() = default;

    ResourceLimits limits_;
    std::string mechanism_;
    std::vector<Directory> directories_;
    std::string memory_dir_;  // where memory.events (v2) or memory.oom_control (v1) lives
    bool cpu_ = false;        // v2: --cpus was given; v1: also a cpu hierarchy was found
};

// Init learns with the cgroup's join files which limits the cgroup holds ("memory pids", one of
// them, or nothing), and drops those rlimits: the cgroup limits the whole sandbox, and the
// per-process rlimits would only add surprises (RLIMIT_AS counts reserved address space, not
// memory).
std::string cgroup_held_limits(const SandboxCgroup& cgroup);
void drop_limits_held_by_cgroup(std::string_view held, ResourceLimits& rlimits);

}  // namespace sqbox

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

// The defaults that bound what one sandbox can make its caller and the host hold; why these
// figures is in docs/run.md ("Output and writable space").
// Bytes of stdout and of stderr passed on to a caller that is not a terminal.
inline constexpr uint64_t kDefaultOutputLimit = 16 * kMiB;
// The sandbox's one writable tmpfs: the root's upper layer, /tmp and /dev/shm together.
inline constexpr uint64_t kDefaultWritableBytes = 1 * kGiB;
inline constexpr unsigned kDefaultImageServerIdleSeconds = 60;
// User namespaces serve's zygote may hold at once, one per request running (docs/serve.md).
inline constexpr unsigned kZygoteUserNamespaces = 1024;
// Where the zygote's sandbox shows its root a second time, with no mounts beneath (rootfs.cpp).
inline constexpr const char* kZygoteLowerDir = "/.sqbox-zygote-lower";

// One mount on top of the sandbox's root, from `--mount`, the image's /etc/fstab or an enroot
// configuration. sqbox always adds nosuid and nodev.
struct MountSpec {
    enum class Kind {
        kBind,    // a tree from the host or from the sandbox itself
        kTmpfs,   // a fresh tmpfs
        kMove,    // move the mount at `source` (in the sandbox) to `destination` (enroot x-move)
        kDetach,  // detach the mount at `destination` (enroot x-detach)
    };
    // kSupervisor: a file sqbox itself provides from its supervisor's private scratch root (the
    // session driver of `sqbox serve`).
    enum class SourceIn { kHost, kSandbox, kSupervisor };
    // How a missing mount point is created (enroot x-create): kAuto follows the source's kind.
    enum class Create { kNever, kDirectory, kFile, kAuto };

    Kind kind = Kind::kBind;
    SourceIn source_in = SourceIn::kHost;
    // kBind from the host: absolute, symlink-free host path (the front end canonicalises it);
    // from the sandbox, or kMove: absolute path inside the sandbox.
    std::string source;
    std::string destination;  // absolute path inside the sandbox
    bool read_only = false;
    bool no_exec = false;
    bool recursive = true;
    Create create = Create::kAuto;
    // Filesystem options of a tmpfs (size, mode, ...); sqbox's caps apply where none is given.
    std::vector<std::pair<std::string, std::string>> filesystem_options;
    bool optional = false;  // fstab "nofail": a failure is a warning, the mount is skipped
    // From the image's own /etc/fstab: untrusted. Its tmpfs mounts share the sandbox's writable
    // budget, and it may move or detach only mounts its own entries made.
    bool from_image = false;
    int pass = 0;        // fstab fs_passno: mounts happen in increasing order of it (stable)
    std::string origin;  // where it came from, for messages ("--mount a:b", "/etc/fstab line 3")

    friend bool operator==(const MountSpec&, const MountSpec&) = default;
};

// Resource limits of one sandbox. Every run has the defaults below (documented in SECURITY.md:
// they keep a 2-core, 24 GiB machine responsive); nullopt means unlimited. Memory, processes
// and CPU share go to a cgroup when sqbox has one (see cgroup_parent), otherwise to rlimits.
struct ResourceLimits {
    std::optional<uint64_t> memory_bytes = 4 * kGiB;  // --memory
    std::optional<uint64_t> processes = 512;          // --pids
    std::optional<uint64_t> cpu_seconds;              // --cpu-time (RLIMIT_CPU)
    // None by default: writes land in the size-capped tmpfs (docs/run.md, "Sizes and limits").
    std::optional<uint64_t> file_size_bytes;    // --fsize (RLIMIT_FSIZE)
    std::optional<uint64_t> open_files = 4096;  // --nofile (RLIMIT_NOFILE)
    std::optional<double> cpus;                 // --cpus (cgroup cpu.max only)

    friend bool operator==(const ResourceLimits&, const ResourceLimits&) = default;
};

// Its JSON form: sqbox/config_json.h.
struct SandboxConfig {
    std::string image;  // a .sqsh file or a root filesystem directory
    // argv of the payload; never empty with Entrypoint::kCommand, may be empty with kEnrootRc.
    std::vector<std::string> command;
    std::vector<MountSpec> mounts;
    // Apply the image's /etc/fstab (its entries may not name host paths).
    bool image_fstab = true;
    // Variables set on top of the image's /etc/environment, in order (later wins).
    std::vector<std::pair<std::string, std::string>> environment;
    // Where ${VAR} in the image's /etc/environment and /etc/fstab is looked up: nullopt means the
    // sandbox's own variables (sqbox run: nothing of the caller's leaks in); the enroot front end
    // passes the caller's environment, as enroot does.
    std::optional<std::vector<std::pair<std::string, std::string>>> substitution_environment;
    std::string workdir = "/";
    // If `workdir` is missing in the image, start in "/" instead of failing (enroot's login
    // behaviour for a HOME the image lacks).
    bool workdir_optional = false;
    std::string hostname = "sandbox";

    bool map_root = false;        // caller appears as uid/gid 0 inside (enroot --root)
    bool read_only_root = false;  // read-only root with a writable /tmp
    // A host directory holding the persistent writable layer of the root ("upper" and "work"
    // inside; an enroot container). Empty: the layer is a tmpfs that vanishes at exit. With
    // read_only_root, the layer is shown read-only and nothing is written to it.
    std::string persistent_layer;
    // Size of the sandbox's one writable tmpfs, shared by the root's upper layer, /tmp, /dev/shm
    // and the image's tmpfs entries (--tmpfs-size).
    uint64_t tmpfs_size_bytes = kDefaultWritableBytes;

    std::optional<double> timeout_seconds;
    ResourceLimits limits;
    // A delegated cgroup v2 directory to create the sandbox's cgroup in; empty: find one (see
    // runtime/cgroups.h).
    std::string cgroup_parent;

    // "default", "strict" (built in), "none", or the path of a profile in Docker's JSON format.
    std::string seccomp_profile = "default";

    // Cap on the bytes of stdout and of stderr that reach the caller; the rest is discarded while
    // the payload runs on. nullopt: unlimited. Output to a terminal is never capped (a terminal
    // holds nothing for its reader). sqbox serve keeps its own defaults per request kind.
    std::optional<uint64_t> output_limit_bytes = kDefaultOutputLimit;
    // Give the payload a terminal of the sandbox's own (the caller's stdin must be a terminal).
    bool tty = false;

    // Identity of the caller outside, mapped into the sandbox's user namespace.
    uid_t outside_uid = 0;
    gid_t outside_gid = 0;
    // The caller's login and primary group names on the host, which the sandbox user takes when
    // they are portable account names; empty: a fallback name (runtime/sandbox_user.h).
    std::string outside_user_name;
    std::string outside_group_name;

    // How the command starts: directly (execvp), or as enroot starts a container: the image's
    // /etc/rc (or rc_script) run by its shell with the command as arguments.
    enum class Entrypoint { kCommand, kEnrootRc };
    Entrypoint entrypoint = Entrypoint::kCommand;
    std::optional<std::string> rc_script;  // contents of enroot's --rc / rc(), replacing /etc/rc
    bool login_shell = true;               // ENROOT_LOGIN_SHELL: the shell runs as a login shell

    // Instead of running a command: write the root's layers (image plus persistent layer) to a
    // new squashfs image at this absolute host path (enroot export).
    std::string export_image_path;

    // .sqsh images: the sandbox mounts a copy of the caller's shared image server's mount
    // (runtime/shared_image.h), which stays this many seconds after its last sandbox has ended;
    // 0: the sandbox serves the image itself, and its server ends with it.
    unsigned image_server_idle_seconds = kDefaultImageServerIdleSeconds;

    bool verbose = false;

    // The sandbox's /proc: a fresh procfs of its own pid namespace (the default), or, where the
    // kernel refuses one (a container whose /proc has masked entries), the caller's own /proc
    // bound in (--proc outer: the payload then sees the caller's processes, see SECURITY.md).
    enum class ProcView { kFresh, kOuter };
    ProcView proc_view = ProcView::kFresh;

    // The payload is `sqbox serve --zygote`'s warm interpreter (docs/serve.md, "The zygote"),
    // which makes each request's sandbox itself: its seccomp filter also allows the unshare,
    // mount and pivot_root that takes (security/zygote_seccomp.h), user namespaces may be made
    // below its own, its /proc shows processes only (no masks to lock, so the kernel lets each
    // child mount one of its own), and Landlock is left to each child (Landlock forbids mounts).
    bool zygote = false;

    friend bool operator==(const SandboxConfig&, const SandboxConfig&) = default;
};

}  // namespace sqbox

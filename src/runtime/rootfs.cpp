#include "runtime/rootfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <system_error>

#include "runtime/devices.h"
#include "runtime/layer_replay.h"
#include "runtime/mount_table.h"
#include "runtime/mounts.h"
#include "runtime/proc_masks.h"
#include "runtime/rooted_path.h"
#include "runtime/sandbox_user.h"
#include "runtime/stage_report.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

UniqueFd open_directory(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) throw system_error("cannot open " + path);
    return fd;
}

// An overlay filesystem, not attached yet, with `options` and userxattr (user.* xattrs: trusted.*
// are not writable from a user namespace), or without it where the kernel knows none (before
// 5.11). Throws Error.
UniqueFd create_overlay(MountOptions options, uint64_t attributes, const std::string& what) {
    options.emplace_back("userxattr", "");
    try {
        return create_filesystem("overlay", options, attributes, what);
    } catch (const Error& e) {
        if (e.system_errno() != EINVAL) throw;
    }
    options.pop_back();
    return create_filesystem("overlay", options, attributes, what);
}

// The overlay: the image (and a container's persistent layer, when it is only shown) below, a
// writable layer above: the sandbox's tmpfs, or a container's persistent layer. Returns 0, or the
// errno with which the kernel refused it.
int try_mount_overlay(const std::string& target, const std::string& lower,
                      const std::string& layer_dir) {
    // No inode-number remapping: with it, every readdir of the image looks up each entry again,
    // which makes Python's start-up (site, import path scans) several ms slower.
    const MountOptions options = {{"lowerdir", lower},
                                  {"upperdir", layer_dir + "/upper"},
                                  {"workdir", layer_dir + "/work"},
                                  {"xino", "off"}};
    try {
        UniqueFd overlay = create_overlay(options, MountAttr::kNoSuid | MountAttr::kNoDev,
                                          "overlay root filesystem");
        attach_mount_at(overlay.get(), target, "overlay root filesystem");
        return 0;
    } catch (const Error& e) {
        return e.system_errno() != 0 ? e.system_errno() : EINVAL;
    }
}

// The overlay root, or false (with a warning) where overlayfs is not permitted.
bool mount_overlay(const std::string& target, const std::string& lower,
                   const std::string& layer_dir) {
    const int err = try_mount_overlay(target, lower, layer_dir);
    if (err == 0) return true;
    // The image server died: nothing to fall back to.
    if (is_lost_image_server(err)) throw system_error("cannot mount the root's overlay", err);
    print_error(std::string("warning: overlayfs is not permitted here (") + std::strerror(err) +
                "); falling back to a read-only root");
    return false;
}

void bind_read_only_image(const std::string& target) {
    UniqueFd tree = clone_mount_tree(AT_FDCWD, kImageDir, true, "image as read-only root");
    set_mount_attributes(tree.get(), MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev,
                         0, true, "read-only root");
    attach_mount_at(tree.get(), target, "read-only root");
}

// A directory of the sandbox's tmpfs, bound at `path`: what is written there takes from the
// sandbox's one writable budget.
void bind_writable_area(int root_fd, const char* area, const std::string& path, uint64_t attributes,
                        bool create) {
    UniqueFd target = resolve_in_root(root_fd, path, EntryKind::kDirectory, create, path);
    UniqueFd tree = clone_mount_tree(AT_FDCWD, writable_area(area), false, path);
    set_mount_attributes(tree.get(), attributes, 0, false, path);
    attach_mount(tree.get(), target.get(), path);
}

void mount_fresh(int root_fd, const std::string& path, const char* fstype,
                 const MountOptions& options, uint64_t attributes, bool create) {
    UniqueFd target = resolve_in_root(root_fd, path, EntryKind::kDirectory, create, path);
    UniqueFd fs = create_filesystem(fstype, options, attributes, path + " (" + fstype + ")");
    attach_mount(fs.get(), target.get(), path);
}

// System V IPC lives in kernel memory that no rlimit counts. These settings belong to the
// sandbox's own ipc namespace: shared memory gets the same budget as /dev/shm, and message
// queues a few MiB in all (256 queues of at most 16 KiB each, the kernel's per-queue default).
// The kernel lets only uid 0 of the namespace's user namespace change them: that is us when the
// caller is root or with --root; otherwise uid 0 is unmapped and the defaults stay (see
// SECURITY.md, "Limits of the model").
void limit_ipc(int root_fd, uint64_t shared_memory_bytes) {
    // Checked first rather than caught: a thrown exception costs a noticeable part of a
    // sandbox start the first time.
    if (::faccessat(root_fd, "proc/sys/kernel/shmmax", W_OK, AT_EACCESS) != 0) {
        if (errno == EACCES) return;
        throw system_error("cannot check proc/sys/kernel/shmmax");
    }
    const uint64_t pages = std::max<uint64_t>(1, shared_memory_bytes / 4096);
    write_file_at(root_fd, "proc/sys/kernel/shmmax", std::to_string(shared_memory_bytes),
                  O_NOFOLLOW);
    write_file_at(root_fd, "proc/sys/kernel/shmall", std::to_string(pages), O_NOFOLLOW);
    write_file_at(root_fd, "proc/sys/kernel/msgmni", "256", O_NOFOLLOW);
}

// std::async on a new thread; where no thread can be had (the caller's process limit), the work
// runs when its result is asked for instead.
template <typename Work>
std::future<void> start_aside(Work work) {
    try {
        return std::async(std::launch::async, work);
    } catch (const std::system_error&) {
        return std::async(std::launch::deferred, work);
    }
}

// The kernel knobs and host information under the sandbox's /proc.
void lock_down_proc(int root_fd, const SandboxConfig& config) {
    // The caller's own /proc (--proc outer) is a container's, whose /proc/sys is read-only: the
    // sysctls below cannot be written through it. sqbox's own seccomp profiles (which --proc
    // outer requires) refuse new user namespaces instead.
    if (config.proc_view == SandboxConfig::ProcView::kFresh) {
        // No user namespaces below the sandbox's own, even with --seccomp none: a new one would
        // give the payload capabilities over it. (This sysctl is per user namespace: it is ours.)
        // serve's zygote makes one for each request's sandbox, whose own seccomp filter then
        // refuses any deeper (security/zygote_seccomp.h).
        write_file_at(root_fd, "proc/sys/user/max_user_namespaces",
                      config.zygote ? std::to_string(kZygoteUserNamespaces) : "0", O_NOFOLLOW);
        limit_ipc(root_fd, config.tmpfs_size_bytes);
    }
    if (!config.zygote) {
        mask_proc(root_fd, config.outside_uid == 0);
        return;
    }
    // serve's zygote: a procfs of only the process directories (subset=pid) on top, so that no
    // host internals need masking. Masks would be locked mounts over the procfs in each request's
    // new namespaces, and the kernel would then refuse each its own procfs (mount_proc); this
    // one covers the whole procfs below, never to be unmounted without capabilities over the
    // sandbox's mount namespace, which no process in it has.
    mount_fresh(root_fd, "/proc", "proc", {{"subset", "pid"}},
                MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, false);
}

// A fresh procfs of the sandbox's pid namespace; or, with --proc outer, the caller's own /proc,
// recursively (with the masks its container put over it, which the kernel would not let go
// without them anyway). The kernel refuses a fresh procfs in a user namespace unless a procfs
// is fully visible in the mount namespace already (fs/namespace.c, mount_too_revealing): in a
// container whose runtime masked entries of its /proc, none is.
void mount_proc(int root_fd, const SandboxConfig& config, bool create) {
    const uint64_t attributes = MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec;
    if (config.proc_view == SandboxConfig::ProcView::kOuter) {
        UniqueFd target = resolve_in_root(root_fd, "/proc", EntryKind::kDirectory, create, "/proc");
        UniqueFd tree =
            clone_mount_tree(AT_FDCWD, std::string(kOldRootDir) + "/proc", true, "your /proc");
        set_mount_attributes(tree.get(), attributes, 0, true, "your /proc");
        attach_mount(tree.get(), target.get(), "/proc");
        return;
    }
    try {
        mount_fresh(root_fd, "/proc", "proc", {}, attributes, create);
    } catch (const Error& e) {
        if (e.system_errno() != EPERM) throw;
        throw Error(
            "cannot mount a fresh /proc: the kernel refuses one while this container's /proc "
            "has masked entries; run the pod with procMount: Unmasked (and hostUsers: false), "
            "or pass --proc outer to show the sandbox your own /proc (sqbox doctor explains)",
            EPERM);
    }
}

struct GeneratedFile {
    const char* name;  // inside /etc
    std::string content;
};

// Writes the file into a writable root, replacing whatever the image has there (a symlink
// included, never followed). Returns false where the image's /etc may not be changed by the
// sandbox user (a directory image owned by someone else), so the caller binds instead.
bool write_into_root(int root_fd, const GeneratedFile& file) {
    const std::string path = std::string("/etc/") + file.name;
    try {
        UniqueFd etc = resolve_in_root(root_fd, "/etc", EntryKind::kDirectory, true, "/etc");
        if (::unlinkat(etc.get(), file.name, 0) != 0 && errno != ENOENT) {
            throw system_error("cannot replace " + path + " in the sandbox");
        }
        write_file_at(etc.get(), file.name, file.content, O_EXCL | O_NOFOLLOW);
        return true;
    } catch (const Error& e) {
        if (e.system_errno() == EACCES || e.system_errno() == EPERM) return false;
        throw;
    }
}

// Bind-mounts a staged copy over a regular file, created first when `create` (a persistent
// layer keeps only that empty mount point, as enroot's x-create=file does). Skipped where the
// image has none and none may be created, or has a symlink there.
void bind_over_root(int root_fd, const GeneratedFile& file, bool create) {
    const std::string path = std::string("/etc/") + file.name;
    UniqueFd target;
    try {
        target = resolve_in_root(root_fd, path, EntryKind::kFile, create, path);
    } catch (const Error&) {
        return;
    }
    const std::string staging = std::string(kSandboxDir) + "/etc";
    if (::mkdir(staging.c_str(), 0755) != 0 && errno != EEXIST) {
        throw system_error("cannot create " + staging);
    }
    const std::string source = staging + "/" + file.name;
    write_file_at(AT_FDCWD, source, file.content);
    UniqueFd tree = clone_mount_tree(AT_FDCWD, source, false, path);
    attach_mount(tree.get(), target.get(), path);
}

// Into a throwaway layer the files are written; over a persistent one (whose contents outlive
// the sandbox) or a read-only root they are bind-mounted.
void install_etc_files(int root_fd, bool writable, bool persistent,
                       const std::vector<GeneratedFile>& files) {
    for (const auto& file : files) {
        if (persistent || !writable || !write_into_root(root_fd, file)) {
            bind_over_root(root_fd, file, writable);
        }
    }
}

std::vector<GeneratedFile> generated_etc_files(const SandboxConfig& config) {
    return {{"hostname", config.hostname + "\n"},
            {"hosts", "127.0.0.1\tlocalhost " + config.hostname +
                          "\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
            {"resolv.conf", "# sqbox: no network but loopback in this sandbox\n"}};
}

// /etc/passwd and /etc/group with the sandbox user's entries (runtime/sandbox_user.h), from the
// image's files in the root at `root`.
void add_account_files(std::vector<GeneratedFile>& files, const SandboxConfig& config,
                       const std::string& root) {
    AccountFiles accounts = sandbox_account_files(open_directory(root).get(), config);
    files.push_back({"passwd", std::move(accounts.passwd)});
    files.push_back({"group", std::move(accounts.group)});
}

// The sandbox's one writable budget: its upper layer, /tmp and /dev/shm (not attached yet).
UniqueFd create_sandbox_tmpfs(const SandboxConfig& config) {
    return create_filesystem("tmpfs", writable_tmpfs_options(config.tmpfs_size_bytes, "0755"),
                             MountAttr::kNoSuid | MountAttr::kNoDev, "sandbox tmpfs");
}

// Writes the generated files straight into the throwaway upper layer, before the overlay is
// mounted: the merged /etc then shows them over the image's, as if they had been written
// through the overlay, without copying the image's /etc up (which asks the image server for
// every name involved). Only where the image's /etc is a plain directory whose owner and mode
// the upper one can take; false otherwise, and the files are written through the root later.
bool seed_upper_etc(int upper_fd, const std::string& lower_etc,
                    const std::vector<GeneratedFile>& files) {
    struct stat lower {};
    if (::lstat(lower_etc.c_str(), &lower) != 0 || !S_ISDIR(lower.st_mode)) return false;
    if (::mkdirat(upper_fd, "etc", 0700) != 0) {
        throw system_error("cannot create /etc in the sandbox's writable layer");
    }
    UniqueFd etc(::openat(upper_fd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!etc) throw system_error("cannot open /etc in the sandbox's writable layer");
    if (::fchown(etc.get(), lower.st_uid, lower.st_gid) != 0 ||
        ::fchmod(etc.get(), lower.st_mode & 07777) != 0) {
        // An owner this user namespace cannot map (a directory image of another user's).
        if (::unlinkat(upper_fd, "etc", AT_REMOVEDIR) != 0) {
            throw system_error("cannot remove /etc from the sandbox's writable layer");
        }
        return false;
    }
    for (const auto& file : files) {
        write_file_at(etc.get(), file.name, file.content, O_EXCL | O_NOFOLLOW);
    }
    return true;
}

// mount_root_layers, with the generated /etc files seeded into a throwaway upper layer where
// that can be done (`etc_seeded` says whether it was).
PreparedRoot mount_layers(const SandboxConfig& config,
                          const std::vector<GeneratedFile>& etc_files) {
    bool etc_seeded = false;
    // Everything writable for this sandbox lives in one size-capped tmpfs: the root's upper
    // layer, /tmp and /dev/shm are directories of it, so their sum is bounded by one budget
    // (and its pages are charged to the memory cgroup of whoever writes them: the sandbox's).
    // A container's --rw start writes there too: the supervisor mounted it, and saves what the
    // sandbox wrote into the container's layer once the sandbox has ended.
    const bool saves_changes = saves_changes_to_container(config);
    UniqueFd sandbox_fs = saves_changes
                              ? UniqueFd(::open(kSandboxDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC))
                              : create_sandbox_tmpfs(config);
    if (!sandbox_fs) throw system_error("cannot open the sandbox's tmpfs");
    for (const char* dir : {"upper", "work", "root"}) {
        if (::mkdirat(sandbox_fs.get(), dir, 0755) != 0) {
            throw system_error(std::string("cannot create sandbox directory ") + dir);
        }
    }
    for (const char* area : {kTmpArea, kShmArea}) {
        // Modes as a fresh tmpfs would get them: the umask does not apply to fchmodat.
        if (::mkdirat(sandbox_fs.get(), area, 0700) != 0 ||
            ::fchmodat(sandbox_fs.get(), area, 01777, 0) != 0) {
            throw system_error(std::string("cannot create sandbox directory ") + area);
        }
    }
    if (!etc_files.empty() && config.persistent_layer.empty()) {
        UniqueFd upper(
            ::openat(sandbox_fs.get(), "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!upper) throw system_error("cannot open the sandbox's writable layer");
        etc_seeded = seed_upper_etc(upper.get(), std::string(kImageDir) + "/etc", etc_files);
    }
    if (!saves_changes) attach_mount_at(sandbox_fs.get(), kSandboxDir, "sandbox tmpfs");

    // The root is assembled writable, so mount points can be created in it, and sealed read-only
    // at the end when asked. A container's persistent layer is one more read-only layer under
    // the sandbox's own (a --rw start's writes reach it when the sandbox has ended).
    const std::string root_path = std::string(kSandboxDir) + "/root";
    std::string lower = kImageDir;
    if (!config.persistent_layer.empty()) {
        lower = std::string(kOldRootDir) + config.persistent_layer + "/upper:" + lower;
    }
    PreparedRoot prepared;
    prepared.writable = mount_overlay(root_path, lower, kSandboxDir);
    if (!prepared.writable) {
        if (!config.persistent_layer.empty()) {
            throw Error(
                "a container's persistent layer needs overlayfs, which is not permitted here");
        }
        bind_read_only_image(root_path);
    }
    prepared.etc_seeded = prepared.writable && etc_seeded;  // unused without the overlay
    prepared.root = open_directory(root_path);
    return prepared;
}

// serve's zygote: the root as it is now (the image, the generated /etc), bound read-only at
// kZygoteLowerDir with nothing mounted beneath, as the lower layer of each request's own root.
// The kernel lets no overlay take "/" for that in the request's namespaces, where /proc, /dev and
// /tmp are locked mounts over it; nor a bind of it there. The request's root shows that directory
// empty (an overlay does not cross mounts).
void bind_zygote_lower(int root_fd) {
    UniqueFd target =
        resolve_in_root(root_fd, kZygoteLowerDir, EntryKind::kDirectory, true, kZygoteLowerDir);
    UniqueFd copy = clone_mount_tree(root_fd, "", false, "the zygote's lower layer");
    set_mount_attributes(copy.get(), MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev,
                         0, false, "the zygote's lower layer read-only");
    attach_mount(copy.get(), target.get(), "the zygote's lower layer");
}

}  // namespace

void enter_scratch_root() {
    make_mounts_private();
    // Only mount points live here; nothing the payload writes ever lands in it.
    UniqueFd scratch = create_filesystem("tmpfs", {{"mode", "0700"}, {"size", "1m"}},
                                         MountAttr::kNoSuid | MountAttr::kNoDev, "scratch tmpfs");
    for (const char* dir : {kOldRootDir, kImageDir, kSandboxDir}) {
        if (::mkdirat(scratch.get(), dir + 1, 0700) != 0) {
            throw system_error(std::string("cannot create scratch directory ") + dir);
        }
    }
    // /tmp is only a place to stand: after pivot_root the host's /tmp shows again under /oldroot.
    attach_mount_at(scratch.get(), "/tmp", "scratch tmpfs");
    if (::chdir("/tmp") != 0) throw system_error("cannot enter the scratch root");
    if (::syscall(SYS_pivot_root, ".", kOldRootDir + 1) != 0) {
        throw system_error("pivot_root into the scratch root");
    }
    if (::chdir("/") != 0) throw system_error("chdir /");
}

void mount_image(const ImageSource& image, int fuse_fd, const IdMapping& ids, FuseUsers users) {
    if (image.kind == ImageSource::Kind::kDirectory) {
        const std::string source = std::string(kOldRootDir) + image.path;
        UniqueFd tree = clone_mount_tree(AT_FDCWD, source, true, "image directory " + image.path);
        set_mount_attributes(tree.get(),
                             MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev, 0, true,
                             "image directory " + image.path);
        attach_mount_at(tree.get(), kImageDir, "image directory " + image.path);
        return;
    }
    MountOptions options = {
        {"source", "sqbox"},
        {"subtype", "sqbox"},
        {"fd", std::to_string(fuse_fd)},
        {"rootmode", "40000"},
        {"user_id", std::to_string(ids.inside_uid)},
        {"group_id", std::to_string(ids.inside_gid)},
        // The kernel, not the server, checks permissions.
        {"default_permissions", ""},
        // A read-only superblock, not just a read-only mount: FUSE otherwise marks a file's
        // access time stale after every read, and the next stat() of it costs a GETATTR round
        // trip (about 15 of them in a cold `python3 -c pass`).
        {"ro", ""},
    };
    // allow_other: the sandbox user (who is not necessarily the mounter's uid) may use the
    // mount. Without it the kernel lets only the mounter's ids in, but from any user namespace.
    if (users == FuseUsers::kThisUserNamespace) options.emplace_back("allow_other", "");
    UniqueFd fs = create_filesystem("fuse", options,
                                    MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev,
                                    "FUSE mount of image " + image.path);
    attach_mount_at(fs.get(), kImageDir, "image " + image.path);
}

bool saves_changes_to_container(const SandboxConfig& config) {
    return !config.persistent_layer.empty() && !config.read_only_root &&
           config.export_image_path.empty();
}

void mount_sandbox_tmpfs_to_keep(const SandboxConfig& config) {
    UniqueFd sandbox_fs = create_sandbox_tmpfs(config);
    attach_mount_at(sandbox_fs.get(), kSandboxDir, "sandbox tmpfs");
}

ReplaySummary save_changes_to_container(const SandboxConfig& config) {
    // The container as a --rw start used to show it: its layer, written through an overlay, so
    // that removals and replaced directories are recorded in overlayfs's own format.
    const std::string layer = std::string(kOldRootDir) + config.persistent_layer;
    if (::mkdir(kContainerViewDir, 0700) != 0 && errno != EEXIST) {
        throw system_error(std::string("cannot create ") + kContainerViewDir);
    }
    if (const int err = try_mount_overlay(kContainerViewDir, kImageDir, layer); err != 0) {
        throw system_error("cannot mount the container's layer", err);
    }
    UniqueFd container(::open(kContainerViewDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!container) throw system_error("cannot open the container's layer");
    const std::string written = std::string(kSandboxDir) + "/upper";
    UniqueFd upper(::open(written.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!upper) throw system_error("cannot open what the sandbox wrote");
    return replay_upper_layer(upper.get(), container.get());
}

PreparedRoot mount_root_layers(const SandboxConfig& config) {
    return mount_layers(config, {});
}

PreparedRoot assemble_rootfs(const SandboxConfig& config) {
    std::vector<GeneratedFile> etc_files = generated_etc_files(config);
    // The sandbox user's accounts merge the image's files: read from the image, so that they can
    // be seeded into a throwaway layer, or from a container's layers once they are mounted.
    if (config.persistent_layer.empty()) add_account_files(etc_files, config, kImageDir);
    PreparedRoot prepared = mount_layers(config, etc_files);
    if (!config.persistent_layer.empty()) {
        add_account_files(etc_files, config, std::string(kSandboxDir) + "/root");
    }
    const bool persistent = !config.persistent_layer.empty() && !config.read_only_root;
    const int root = prepared.root.get();
    const bool create = prepared.writable;
    if (config.zygote) bind_zygote_lower(root);

    // Order matters: system mounts first, the mount table last so it may sit on top of them.
    mount_proc(root, config, create);
    {
        // /proc is locked down on a second thread while /dev, /tmp and /etc are set up: neither
        // touches the other's paths. Joined, and its error rethrown, before the mount table,
        // which may mount over any of them.
        std::future<void> proc_locked =
            start_aside([&config, root] { lock_down_proc(root, config); });
        mount_devices(root, create, writable_area(kShmArea));
        bind_writable_area(root, kTmpArea, "/tmp", MountAttr::kNoSuid | MountAttr::kNoDev, create);
        if (!prepared.etc_seeded) install_etc_files(root, prepared.writable, persistent, etc_files);
        proc_locked.get();
    }
    apply_mount_table(root, config, create);
    if (config.read_only_root && prepared.writable) {
        set_mount_attributes(root, MountAttr::kReadOnly, 0, false, "read-only root");
        prepared.writable = false;
    }
    return prepared;
}

}  // namespace sqbox

#include "runtime/proc_masks.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <string>

#include "runtime/mounts.h"
#include "runtime/rooted_path.h"
#include "runtime/rootfs.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// Kernel memory and symbols, keys, timers and scheduler internals of the whole machine, the
// host's modules and hardware map.
constexpr const char* kHiddenFiles[] = {
    "kcore",       "kallsyms",      "keys",       "key-users",   "timer_list",  "timer_stats",
    "sched_debug", "latency_stats", "kmsg",       "modules",     "vmallocinfo", "iomem",
    "ioports",     "kpagecount",    "kpageflags", "kpagecgroup", "slabinfo",    "config.gz",
};
// Host hardware and drivers.
constexpr const char* kHiddenDirectories[] = {"acpi", "asound", "scsi", "driver", "dynamic_debug"};
// Kernel settings: readable, never writable.
constexpr const char* kReadOnly[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};

// An O_PATH descriptor of /proc/`name`; none if it does not exist. `info` is filled if given.
UniqueFd open_entry(int proc_fd, const char* name, struct stat* info) {
    UniqueFd entry(::openat(proc_fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!entry) {
        if (errno == ENOENT) return entry;
        throw system_error(std::string("cannot open /proc/") + name);
    }
    if (info != nullptr && ::fstat(entry.get(), info) != 0) {
        throw system_error(std::string("stat /proc/") + name);
    }
    return entry;
}

// An O_PATH descriptor of `path`, to copy mounts of.
UniqueFd open_mount_source(const std::string& path) {
    UniqueFd source(::open(path.c_str(), O_PATH | O_CLOEXEC));
    if (!source) throw system_error("cannot open " + path);
    return source;
}

}  // namespace

void mask_proc(int root_fd, bool payload_is_host_root) {
    UniqueFd proc = resolve_in_root(root_fd, "/proc", EntryKind::kDirectory, false, "/proc");
    // The host's null device (as the sandbox's /dev/null is), never a path of the image's; looked
    // up once, each cover a copy of its mount.
    UniqueFd null_device;
    for (const char* name : kHiddenFiles) {
        struct stat info {};
        // Files only the host's root can read need no cover from anyone else.
        UniqueFd target = open_entry(proc.get(), name, payload_is_host_root ? nullptr : &info);
        if (!target) continue;
        if (!payload_is_host_root && (info.st_mode & S_IROTH) == 0) continue;
        if (!null_device) null_device = open_mount_source(std::string(kOldRootDir) + "/dev/null");
        UniqueFd cover =
            clone_mount_tree(null_device.get(), "", false, std::string("/proc/") + name);
        attach_mount(cover.get(), target.get(), std::string("/proc/") + name);
    }
    // Each hidden directory is covered by a read-only bind of one empty directory of the
    // sandbox's own tmpfs (a tmpfs of its own each would cost a superblock per directory).
    const std::string empty = std::string(kSandboxDir) + "/proc-empty";
    UniqueFd empty_directory;
    for (const char* name : kHiddenDirectories) {
        struct stat info {};
        UniqueFd target = open_entry(proc.get(), name, &info);
        if (!target || !S_ISDIR(info.st_mode)) continue;
        if (!empty_directory) {
            if (::mkdir(empty.c_str(), 0555) != 0) throw system_error("cannot create " + empty);
            empty_directory = open_mount_source(empty);
        }
        const std::string what = std::string("/proc/") + name;
        UniqueFd cover = clone_mount_tree(empty_directory.get(), "", false, what);
        set_mount_attributes(
            cover.get(),
            MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, 0,
            false, what + " read-only");
        attach_mount(cover.get(), target.get(), what);
    }
    for (const char* name : kReadOnly) {
        UniqueFd target = open_entry(proc.get(), name, nullptr);
        if (!target) continue;
        UniqueFd copy = clone_mount_tree(target.get(), "", true, std::string("/proc/") + name);
        set_mount_attributes(
            copy.get(),
            MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, 0,
            true, std::string("/proc/") + name + " read-only");
        attach_mount(copy.get(), target.get(), std::string("/proc/") + name);
    }
}

}  // namespace sqbox

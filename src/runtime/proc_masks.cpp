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

UniqueFd open_entry(int proc_fd, const char* name, struct stat& info) {
    UniqueFd entry(::openat(proc_fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!entry) {
        if (errno == ENOENT) return entry;
        throw system_error(std::string("cannot open /proc/") + name);
    }
    if (::fstat(entry.get(), &info) != 0) throw system_error(std::string("stat /proc/") + name);
    return entry;
}

}  // namespace

void mask_proc(int root_fd, bool payload_is_host_root) {
    UniqueFd proc = resolve_in_root(root_fd, "/proc", EntryKind::kDirectory, false, "/proc");
    for (const char* name : kHiddenFiles) {
        struct stat info {};
        UniqueFd target = open_entry(proc.get(), name, info);
        if (!target) continue;
        if (!payload_is_host_root && (info.st_mode & S_IROTH) == 0) continue;  // host root's
        // The host's null device (as the sandbox's /dev/null is), never a path of the image's.
        UniqueFd cover = clone_mount_tree(AT_FDCWD, std::string(kOldRootDir) + "/dev/null", false,
                                          std::string("/proc/") + name);
        attach_mount(cover.get(), target.get(), std::string("/proc/") + name);
    }
    // Each hidden directory is covered by a read-only bind of one empty directory of the
    // sandbox's own tmpfs (a tmpfs of its own each would cost a superblock per directory).
    const std::string empty = std::string(kSandboxDir) + "/proc-empty";
    bool empty_made = false;
    for (const char* name : kHiddenDirectories) {
        struct stat info {};
        UniqueFd target = open_entry(proc.get(), name, info);
        if (!target || !S_ISDIR(info.st_mode)) continue;
        if (!empty_made) {
            if (::mkdir(empty.c_str(), 0555) != 0) throw system_error("cannot create " + empty);
            empty_made = true;
        }
        const std::string what = std::string("/proc/") + name;
        UniqueFd cover = clone_mount_tree(AT_FDCWD, empty, false, what);
        set_mount_attributes(
            cover.get(),
            MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, 0,
            false, what + " read-only");
        attach_mount(cover.get(), target.get(), what);
    }
    for (const char* name : kReadOnly) {
        struct stat info {};
        UniqueFd target = open_entry(proc.get(), name, info);
        if (!target) continue;
        UniqueFd copy = clone_mount_tree(proc.get(), name, true, std::string("/proc/") + name);
        set_mount_attributes(
            copy.get(),
            MountAttr::kReadOnly | MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, 0,
            true, std::string("/proc/") + name + " read-only");
        attach_mount(copy.get(), target.get(), std::string("/proc/") + name);
    }
}

}  // namespace sqbox

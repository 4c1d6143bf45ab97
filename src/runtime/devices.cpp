#include "runtime/devices.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "runtime/mounts.h"
#include "runtime/rooted_path.h"
#include "runtime/rootfs.h"
#include "util/errors.h"

namespace sqbox {
namespace {

constexpr const char* kHostDevices[] = {"null", "zero", "full", "random", "urandom", "tty"};

struct DevLink {
    const char* name;
    const char* target;
};
constexpr DevLink kLinks[] = {
    {"ptmx", "pts/ptmx"},          {"fd", "/proc/self/fd"},       {"stdin", "/proc/self/fd/0"},
    {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
};

}  // namespace

void mount_devices(int root_fd, bool create_mount_point, const std::string& shm_source) {
    UniqueFd mount_point =
        resolve_in_root(root_fd, "/dev", EntryKind::kDirectory, create_mount_point, "/dev");
    UniqueFd dev_fs = create_filesystem("tmpfs", {{"mode", "0755"}, {"size", "64k"}},
                                        MountAttr::kNoSuid | MountAttr::kNoExec, "/dev tmpfs");
    attach_mount(dev_fs.get(), mount_point.get(), "/dev");
    // Re-open: the fd resolved before the mount still names the directory underneath it.
    UniqueFd dev(::openat(root_fd, "dev", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dev) throw system_error("cannot open the sandbox's /dev");

    for (const char* name : kHostDevices) {
        const std::string what = std::string("/dev/") + name;
        int created = ::openat(dev.get(), name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (created < 0) throw system_error("cannot create " + what);
        (void)::close(created);
        UniqueFd target(::openat(dev.get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
        if (!target) throw system_error("cannot open " + what);
        UniqueFd node =
            clone_mount_tree(AT_FDCWD, std::string(kOldRootDir) + "/dev/" + name, false, what);
        set_mount_attributes(node.get(), MountAttr::kNoSuid | MountAttr::kNoExec, 0, false, what);
        attach_mount(node.get(), target.get(), what);
    }

    for (const char* dir : {"pts", "shm"}) {
        if (::mkdirat(dev.get(), dir, 0755) != 0) {
            throw system_error(std::string("cannot create /dev/") + dir);
        }
    }
    UniqueFd pts_dir(::openat(dev.get(), "pts", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd shm_dir(::openat(dev.get(), "shm", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!pts_dir || !shm_dir) throw system_error("cannot open /dev/pts or /dev/shm");
    UniqueFd pts = create_filesystem("devpts", {{"ptmxmode", "0666"}, {"mode", "0620"}},
                                     MountAttr::kNoSuid | MountAttr::kNoExec, "/dev/pts (devpts)");
    attach_mount(pts.get(), pts_dir.get(), "/dev/pts");
    UniqueFd shm = clone_mount_tree(AT_FDCWD, shm_source, false, "/dev/shm");
    set_mount_attributes(shm.get(), MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, 0,
                         false, "/dev/shm");
    attach_mount(shm.get(), shm_dir.get(), "/dev/shm");

    for (const auto& link : kLinks) {
        if (::symlinkat(link.target, dev.get(), link.name) != 0) {
            throw system_error(std::string("cannot create /dev/") + link.name);
        }
    }
    // Nothing more belongs in /dev; the mounts on top of it keep their own flags.
    set_mount_attributes(dev_fs.get(), MountAttr::kReadOnly, 0, false, "/dev");
}

}  // namespace sqbox

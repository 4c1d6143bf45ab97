#include "runtime/mounts.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/errors.h"

namespace sqbox {

const uint64_t MountAttr::kReadOnly = MOUNT_ATTR_RDONLY;
const uint64_t MountAttr::kNoSuid = MOUNT_ATTR_NOSUID;
const uint64_t MountAttr::kNoDev = MOUNT_ATTR_NODEV;
const uint64_t MountAttr::kNoExec = MOUNT_ATTR_NOEXEC;

namespace {

Error mount_error(const std::string& what, int err) {
    std::string message = what + ": " + std::strerror(err);
    if (err == ENOSYS) message += " (this kernel lacks the mount API sqbox needs: Linux >= 5.12)";
    return Error(message, err);
}

}  // namespace

UniqueFd create_filesystem(const char* fstype, const MountOptions& options, uint64_t attributes,
                           const std::string& what) {
    UniqueFd context(::fsopen(fstype, FSOPEN_CLOEXEC));
    if (!context) throw mount_error("cannot create " + what, errno);
    for (const auto& [key, value] : options) {
        int rc =
            value.empty()
                ? ::fsconfig(context.get(), FSCONFIG_SET_FLAG, key.c_str(), nullptr, 0)
                : ::fsconfig(context.get(), FSCONFIG_SET_STRING, key.c_str(), value.c_str(), 0);
        if (rc != 0) {
            throw mount_error("cannot set option " + key + " of " + what, errno);
        }
    }
    if (::fsconfig(context.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
        throw mount_error("cannot create " + what, errno);
    }
    UniqueFd mount(::fsmount(context.get(), FSMOUNT_CLOEXEC, static_cast<unsigned>(attributes)));
    if (!mount) throw mount_error("cannot mount " + what, errno);
    return mount;
}

MountOptions writable_tmpfs_options(uint64_t size_bytes, const char* mode) {
    constexpr uint64_t kBytesPerInode = 16 * 1024;
    constexpr uint64_t kMinInodes = 1024;
    const uint64_t inodes = std::max(kMinInodes, size_bytes / kBytesPerInode);
    return {{"mode", mode},
            {"size", std::to_string(size_bytes)},
            {"nr_inodes", std::to_string(inodes)}};
}

UniqueFd clone_mount_tree(int dir_fd, const std::string& path, bool recursive,
                          const std::string& what) {
    unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC;
    if (recursive) flags |= AT_RECURSIVE;
    if (path.empty()) flags |= AT_EMPTY_PATH;
    UniqueFd tree(::open_tree(dir_fd, path.c_str(), flags));
    if (!tree) throw mount_error("cannot bind " + what, errno);
    return tree;
}

void set_mount_attributes(int mount_fd, uint64_t set, uint64_t clear, bool recursive,
                          const std::string& what) {
    mount_attr attr{};
    attr.attr_set = set;
    attr.attr_clr = clear;
    unsigned flags = AT_EMPTY_PATH;
    if (recursive) flags |= AT_RECURSIVE;
    if (::mount_setattr(mount_fd, "", flags, &attr, sizeof attr) != 0) {
        throw mount_error("cannot set attributes of " + what, errno);
    }
}

void attach_mount(int mount_fd, int target_fd, const std::string& what) {
    if (::move_mount(mount_fd, "", target_fd, "",
                     MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
        throw mount_error("cannot mount " + what, errno);
    }
}

void attach_mount_at(int mount_fd, const std::string& target, const std::string& what) {
    if (::move_mount(mount_fd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
        throw mount_error("cannot mount " + what + " on " + target, errno);
    }
}

void make_mounts_private() {
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        throw system_error("cannot make mounts private");
    }
}

void pivot_into(int new_root_fd) {
    // pivot_root(".", ".") stacks the old root on top of the new one; detaching "." then removes
    // the old root and every mount below it, leaving no path back to the host.
    if (::fchdir(new_root_fd) != 0) throw system_error("cannot enter the new root");
    if (::syscall(SYS_pivot_root, ".", ".") != 0) throw system_error("pivot_root");
    if (::umount2(".", MNT_DETACH) != 0) throw system_error("cannot detach the old root");
    if (::chdir("/") != 0) throw system_error("chdir /");
}

}  // namespace sqbox

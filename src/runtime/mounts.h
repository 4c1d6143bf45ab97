// Thin, checked wrappers over the kernel's file-descriptor based mount API (Linux >= 5.12):
// filesystems are created detached, configured, and attached to a target named by an fd, so no
// path is looked up twice and no symlink can redirect a mount.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

using MountOptions = std::vector<std::pair<std::string, std::string>>;  // value "" = flag option

// Mount attribute bits (MOUNT_ATTR_*), re-exported so callers need no kernel headers.
struct MountAttr {
    static const uint64_t kReadOnly;
    static const uint64_t kNoSuid;
    static const uint64_t kNoDev;
    static const uint64_t kNoExec;
};

// Options of a tmpfs the payload can write to: `size_bytes` of data and one inode per 16 KiB of
// it (at least 1024). Inodes live in kernel memory outside the size cap, so without their own cap
// a 1 MiB tmpfs could still pin gigabytes of it.
MountOptions writable_tmpfs_options(uint64_t size_bytes, const char* mode);

// fsopen + fsconfig + fsmount: a new, detached instance of `fstype`. `what` names it in errors.
UniqueFd create_filesystem(const char* fstype, const MountOptions& options, uint64_t attributes,
                           const std::string& what);

// open_tree(OPEN_TREE_CLONE): a detached copy of the mount(s) at `path`.
UniqueFd clone_mount_tree(int dir_fd, const std::string& path, bool recursive,
                          const std::string& what);

// mount_setattr on a mount (and its submounts when `recursive`).
void set_mount_attributes(int mount_fd, uint64_t set, uint64_t clear, bool recursive,
                          const std::string& what);

// move_mount: attaches the detached mount `mount_fd` on top of the file or directory `target_fd`.
void attach_mount(int mount_fd, int target_fd, const std::string& what);

// Same, with the target given as a path (relative to the current root/cwd).
void attach_mount_at(int mount_fd, const std::string& target, const std::string& what);

// Marks every mount of the calling process's namespace private, so nothing done here propagates
// back to the host (the namespace was copied with the host's shared propagation).
void make_mounts_private();

// Changes the root of the calling process to the directory `new_root_fd` (a mount point) and
// detaches the old root with everything mounted under it.
void pivot_into(int new_root_fd);

}  // namespace sqbox

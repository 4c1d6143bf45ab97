// The in-process FUSE server that exposes a squashfs image to the kernel.
#pragma once

#include <sys/types.h>

#include <string>

struct sqfs_ll;

namespace sqbox {

// Presents every file of the image as owned by `owner_uid`/`owner_gid` (ids in the user namespace
// that mounted the FUSE connection). Like enroot's unpacked rootfs, the whole image then belongs
// to the sandbox user, and overlayfs can copy files up without unmapped owners.
struct SquashfsServerOptions {
    uid_t owner_uid = 0;
    gid_t owner_gid = 0;
    // Where the image is mounted in the server's mount namespace; the prefetch thread opens files
    // there (none without it).
    std::string mount_point;
    // A learning run's record file (image/warm_up_list.h); -1 when not learning.
    int learn_fd = -1;
};

// Serves FUSE requests arriving on `fuse_fd` (an open /dev/fuse already mounted) from the image
// loaded in `image` until the connection goes away. Requests are answered on the calling thread;
// a second thread prefetches (image/squashfs_prefetch.h). Returns the libfuse status.
int serve_squashfs(sqfs_ll* image, int fuse_fd, const SquashfsServerOptions& options);

}  // namespace sqbox

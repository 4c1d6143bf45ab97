// The in-process FUSE server that exposes a squashfs image to the kernel.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

struct sqfs_ll;
struct fuse_session;

namespace sqbox {

// What a server notes for the one started after it on the same connection (sqbox serve restarts
// a server that died; the connection lives on in the supervisor's copy of /dev/fuse): the request
// it is answering, which the supervisor then fails with EIO (the kernel would otherwise wait for
// its answer for good), and the connection's INIT request, which the next server replays to its
// own libfuse session without answering the kernel again. Shared memory; a server taken over can
// write anything here, which costs at most one request's answer and the next server's start.
struct ServerRecord {
    uint64_t request_unique = 0;  // 0: none
    uint32_t init_size = 0;
    unsigned char init[512] = {};
};

// How the server answers the kernel's OPEN of a file of the image.
enum class FileOpens {
    // Each open is a round trip (OPEN, and RELEASE once the last descriptor closes), answered with
    // FOPEN_NOFLUSH: a close never waits for this server.
    kAnswered,
    // The first OPEN is refused with ENOSYS: the kernel then opens files of the connection with no
    // message at all (no OPEN, no RELEASE, contents kept cached). But each close of a file then
    // sends FLUSH and waits for it, until one FLUSH is refused (ENOSYS) and the kernel stops
    // sending them for the connection. Whoever mounts it opens and closes one file of the image
    // before anything else holds files of it (runtime/shared_image.cpp says why).
    kWithoutMessages,
};

// Presents every file of the image as owned by `owner_uid`/`owner_gid` (ids in the user namespace
// that mounted the FUSE connection). Like enroot's unpacked rootfs, the whole image then belongs
// to the sandbox user, and overlayfs can copy files up without unmapped owners.
struct SquashfsServerOptions {
    uid_t owner_uid = 0;
    gid_t owner_gid = 0;
    // Where the image is mounted in the server's mount namespace; the prefetch thread opens files
    // there (none without it).
    std::string mount_point;
    // sqbox serve: shared with the supervisor (see ServerRecord); null otherwise.
    ServerRecord* record = nullptr;
    FileOpens file_opens = FileOpens::kAnswered;
};

// The libfuse session that answers requests from `image` with the server's operations (and, with
// a mount point, starts the prefetch thread), attached to no device yet: serve_squashfs attaches
// it to the mounted /dev/fuse, the fuzz targets (tests/fuzz) feed it requests without a kernel.
// One session per process at a time: a new one replaces the previous one's state. Null if libfuse
// cannot make one.
fuse_session* new_squashfs_session(sqfs_ll* image, const SquashfsServerOptions& options);

// Serves FUSE requests arriving on `fuse_fd` (an open /dev/fuse already mounted) from the image
// loaded in `image` until the connection goes away. Requests are answered on the calling thread;
// a second thread prefetches (image/squashfs_prefetch.h). Returns the libfuse status.
int serve_squashfs(sqfs_ll* image, int fuse_fd, const SquashfsServerOptions& options);

}  // namespace sqbox

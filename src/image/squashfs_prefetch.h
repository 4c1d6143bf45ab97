// Pushes image files into the kernel's page cache ahead of the reads that will want them.
//
// A fresh sandbox starts with an empty page cache on its FUSE mount, so every page its payload
// touches would otherwise cost a FUSE round trip (request, wake-up of the server, reply, wake-up
// of the payload). Most of those pages are predictable: a program that opens a file (or the
// dynamic loader mapping a library) goes on to read more of it. A background thread therefore
// reads the rest of each file the kernel starts reading and hands it to the kernel with
// FUSE_NOTIFY_STORE, on another CPU, while the payload runs.
//
// Only reads start a prefetch, not lookups: stat-heavy payloads (ls -l, find, pip) look up many
// files they never open, and pushing those would only burn the CPU the payload runs on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "image/squashfuse_api.h"

struct fuse_session;

namespace sqbox {

// Bounds on what one mount prefetches. The pages pushed are charged to the server's memory
// cgroup (the caller's), not the sandbox's, and they are clean page cache the kernel can drop at
// any time; the budget keeps what a payload can make the server read small all the same.
struct PrefetchLimits {
    uint64_t per_file_bytes = 16ull << 20;
    uint64_t total_bytes = 128ull << 20;
};

class SquashfsPrefetcher {
  public:
    // Starts the worker thread, which opens its own view of the image on `image_fd`
    // (libsquashfuse's caches are not thread-safe, so the serving thread and the worker never
    // share them). `image_fd` must stay open for the life of the process.
    SquashfsPrefetcher(int image_fd, fuse_session* session, PrefetchLimits limits);
    // Tells the worker to stop and lets it finish on its own: it may be waiting for the kernel to
    // unlock a page, which only an answer of the serving thread or the end of the connection does.
    ~SquashfsPrefetcher();
    SquashfsPrefetcher(const SquashfsPrefetcher&) = delete;
    SquashfsPrefetcher& operator=(const SquashfsPrefetcher&) = delete;

    // Called by the serving thread after it answered a read of a regular file: queues the rest of
    // the file after `read_end`, once per file.
    void file_read(fuse_ino_t ino, const sqfs_inode& inode, uint64_t read_end);

    struct State;  // shared with the worker thread, which may outlive this object

  private:
    std::shared_ptr<State> state_;
};

}  // namespace sqbox

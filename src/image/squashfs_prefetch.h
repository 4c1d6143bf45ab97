// Reads image files ahead of the payload, through the FUSE mount itself.
//
// A fresh sandbox starts with an empty page cache on its FUSE mount, so every page its payload
// touches would otherwise cost a FUSE round trip in which the payload waits: request, wake-up of
// the server, reply, wake-up of the payload. Most of those pages are predictable: a program that
// opens a file (or the dynamic loader mapping a library) goes on to read more of it. So when the
// kernel starts reading a file, a second thread of the server opens the same file on the mount
// and asks the kernel to read the rest ahead (readahead(2)). The kernel sends those reads without
// anyone waiting for them, the serving thread answers them between the payload's requests, and
// the payload then finds the pages cached.
//
// Asking the kernel, rather than pushing pages in with FUSE_NOTIFY_STORE, is what keeps the server
// killable: a store waits, unkillably, for pages locked by a read in flight, which only the
// serving thread can answer; killed meanwhile, the server would hang on to the connection for
// good. A readahead never waits for a locked page, and its other waits are killable.
//
// Only reads start a prefetch, not lookups: stat-heavy payloads (ls -l, find, pip) look up many
// files they never open, and reading those would only take time from the payload.
//
// A thread of the server waiting for an answer from its own server cannot be killed once the
// request has been read (the kernel then waits, uninterruptibly, for the answer). So the worker
// looks nothing up: it opens files only through names the kernel has cached (RESOLVE_CACHED;
// what must be looked up ahead is looked up by the supervisor, runtime/look_ahead.h), and
// readahead(2) does not wait. The one request it may wait for is the OPEN of a server that
// answers opens (FileOpens::kAnswered); for that, it has a descriptor table of its own with no
// /dev/fuse in it, so the serving thread's death closes the device and the kernel aborts the
// connection, which ends the wait.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "image/image_names.h"
#include "image/squashfuse_api.h"

namespace sqbox {

// Bounds on what one mount reads ahead. The pages are charged to the server's memory cgroup (the
// caller's), not the sandbox's, and they are clean page cache the kernel can drop at any time;
// the budget keeps what a payload can make the server read small all the same.
struct PrefetchLimits {
    uint64_t per_file_bytes = 16ull << 20;
    uint64_t total_bytes = 128ull << 20;
};

class SquashfsPrefetcher {
  public:
    // `mount_point`: where the image is mounted in the server's own mount namespace.
    // `names`: the serving thread's, for finding a file's path; it must outlive this object.
    SquashfsPrefetcher(std::string mount_point, const ImageNames& names, PrefetchLimits limits);
    // Tells the worker to stop and lets it finish on its own (it holds no lock anyone waits for).
    ~SquashfsPrefetcher();
    SquashfsPrefetcher(const SquashfsPrefetcher&) = delete;
    SquashfsPrefetcher& operator=(const SquashfsPrefetcher&) = delete;

    // Called by the serving thread after it answered a read of a regular file: queues the rest of
    // the file after `read_end`, once per file.
    void file_read(fuse_ino_t ino, uint64_t file_size, uint64_t read_end);

    struct State;  // shared with the worker thread, which may outlive this object

  private:
    // The serving thread's bookkeeping; the worker sees only the jobs it is handed.
    const ImageNames* names_;
    std::unordered_set<fuse_ino_t> queued_;
    PrefetchLimits limits_;
    uint64_t budget_left_;
    std::shared_ptr<State> state_;
};

}  // namespace sqbox

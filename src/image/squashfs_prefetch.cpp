#include "image/squashfs_prefetch.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {
namespace {

// One FUSE read's worth (the kernel's readahead unit on a FUSE mount). Files are read ahead a
// chunk at a time, round robin, so a small file opened after a large one does not wait for all
// of the large one.
constexpr uint64_t kChunkBytes = uint64_t{128} << 10;

// Files being read ahead at once, each with a descriptor open; more wait their turn.
constexpr size_t kMaxOpenFiles = 32;

constexpr int kWorkerNice = 10;

}  // namespace

struct SquashfsPrefetcher::State {
    struct Job {
        std::string path;
        uint64_t offset;
        uint64_t end;
        UniqueFd file;  // opened by the worker on its first chunk
    };

    std::string mount_point;

    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Job> waiting;  // not started yet
    bool stopping = false;

    void enqueue(std::string path, uint64_t offset, uint64_t end) {
        std::lock_guard lock(mutex);
        waiting.push_back({std::move(path), offset, end, UniqueFd()});
        wake.notify_one();
    }

    void run() {
        // A lower priority (raising one's own nice value needs no privilege): on a busy machine
        // the serving thread and the payloads go first.
        (void)setpriority(PRIO_PROCESS, 0, kWorkerNice);  // 0: this thread (Linux)
        // A descriptor table of its own, emptied: /dev/fuse must be held by the serving thread
        // alone. This thread's opens of the mount still send OPEN (FileOpens::kAnswered), and a
        // thread waiting for an answer its own server read but never gave cannot be killed;
        // were /dev/fuse in its table too, a server killed (or crashed) meanwhile would never
        // close it, and the connection, the server and its sandbox would live on for good.
        // With it in the serving thread's table only, that thread's exit closes the device and
        // the kernel aborts the connection, which ends the wait. Without its own table, no job
        // runs.
        if (::unshare(CLONE_FILES) != 0 || ::syscall(SYS_close_range, 0U, ~0U, 0U) != 0) return;
        // Only this thread opens or closes descriptors of its table, so the job's and the root's
        // descriptors are its own; none may outlive it in State, which the serving thread may
        // destroy. An O_PATH open of the mount's root asks the server nothing.
        const UniqueFd root(::open(mount_point.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!root) return;
        std::deque<Job> active;
        for (;;) {
            {
                std::unique_lock lock(mutex);
                wake.wait(lock, [&] { return stopping || !waiting.empty() || !active.empty(); });
                if (stopping) return;
                while (active.size() < kMaxOpenFiles && !waiting.empty()) {
                    active.push_back(std::move(waiting.front()));
                    waiting.pop_front();
                }
            }
            Job job = std::move(active.front());
            active.pop_front();
            if (read_ahead_chunk(root.get(), job)) active.push_back(std::move(job));
        }
    }

    // Asks the kernel to read the next chunk of `job`; true if the job has more to do. Any
    // failure just ends the job: the payload's own reads still work.
    static bool read_ahead_chunk(int root, Job& job) {
        if (!job.file) {
            // Only through names the kernel has cached (RESOLVE_CACHED): a lookup would be a
            // request to this very process, and a thread of the server waiting on its own
            // server cannot be killed once the request is read (see the header).
            open_how how{};
            how.flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
            how.resolve = RESOLVE_CACHED | RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
            const std::string relative = job.path.substr(1);  // below the mount's root
            job.file.reset(
                static_cast<int>(::syscall(SYS_openat2, root, relative.c_str(), &how, sizeof how)));
            if (!job.file) return false;
        }
        const uint64_t length = std::min(kChunkBytes, job.end - job.offset);
        if (::readahead(job.file.get(), static_cast<off64_t>(job.offset), length) != 0) {
            return false;
        }
        job.offset += length;
        return job.offset < job.end;
    }
};

SquashfsPrefetcher::SquashfsPrefetcher(std::string mount_point, const ImageNames& names,
                                       PrefetchLimits limits)
    : names_(&names),
      limits_(limits),
      budget_left_(limits.total_bytes),
      state_(std::make_shared<State>()) {
    state_->mount_point = std::move(mount_point);
    std::thread([state = state_] { state->run(); }).detach();
}

SquashfsPrefetcher::~SquashfsPrefetcher() {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
    state_->wake.notify_one();
}

void SquashfsPrefetcher::file_read(fuse_ino_t ino, uint64_t file_size, uint64_t read_end) {
    if (read_end >= file_size || budget_left_ == 0 || !queued_.insert(ino).second) return;
    std::string path = names_->path_of(ino);
    if (path.empty()) return;
    const uint64_t length = std::min({file_size - read_end, limits_.per_file_bytes, budget_left_});
    budget_left_ -= length;
    state_->enqueue(std::move(path), read_end, read_end + length);
}

}  // namespace sqbox

#include "image/squashfs_prefetch.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "image/squashfs_extents.h"

namespace sqbox {
namespace {

// One FUSE read's worth (the kernel's readahead unit on a FUSE mount): a file is never locked up
// by the worker for longer than one chunk takes.
constexpr uint64_t kChunkBytes = uint64_t{128} << 10;

constexpr int kWorkerNice = 10;

}  // namespace

struct SquashfsPrefetcher::State {
    struct Job {
        fuse_ino_t ino;
        sqfs_inode inode;
        uint64_t offset;
        uint64_t end;
    };

    sqfs fs{};
    fuse_session* session = nullptr;
    PrefetchLimits limits;

    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Job> jobs;
    std::unordered_set<fuse_ino_t> queued;
    uint64_t budget_left = 0;
    bool stopping = false;
    int image_fd = -1;
    std::vector<ImageExtent> extents;  // scratch space of push_chunk
    std::vector<char> storage;

    ~State() { sqfs_destroy(&fs); }

    void enqueue(fuse_ino_t ino, const sqfs_inode& inode, uint64_t offset) {
        const uint64_t size = inode.xtra.reg.file_size;
        if (offset >= size) return;
        std::lock_guard lock(mutex);
        if (budget_left == 0 || !queued.insert(ino).second) return;
        const uint64_t length = std::min({size - offset, limits.per_file_bytes, budget_left});
        budget_left -= length;
        jobs.push_back({ino, inode, offset, offset + length});
        wake.notify_one();
    }

    // Files are pushed one chunk at a time, round robin: a small file opened after a large one
    // does not wait for all of the large one.
    void run() {
        // A lower priority (raising one's own nice value needs no privilege) so that on a busy
        // machine the serving thread and the payloads go first. Not SCHED_IDLE: measured, the
        // worker then rarely runs before the payload asks for the data itself.
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWorkerNice);
        // Opened here, not in the constructor, so the serving thread answers the kernel's first
        // requests without waiting for it. Unreadable, the worker gives up: reads still work.
        if (sqfs_init(&fs, image_fd, 0) != SQFS_OK) {
            std::lock_guard lock(mutex);
            budget_left = 0;  // nothing more gets queued
            jobs.clear();
            return;
        }
        std::vector<char> buffer(kChunkBytes);
        for (;;) {
            Job job;
            {
                std::unique_lock lock(mutex);
                wake.wait(lock, [this] { return stopping || !jobs.empty(); });
                if (stopping) return;
                job = jobs.front();
                jobs.pop_front();
            }
            if (push_chunk(job, buffer)) {
                std::lock_guard lock(mutex);
                jobs.push_back(job);
            }
        }
    }

    // Pushes the next chunk of `job`; true if the job has more to do.
    bool push_chunk(Job& job, std::vector<char>& buffer) {
        uint64_t length = std::min<uint64_t>(kChunkBytes, job.end - job.offset);
        const auto offset = static_cast<off_t>(job.offset);
        int status = 0;
        if (find_stored_extents(&fs, &job.inode, job.offset, length, extents)) {
            // Stored blocks: the kernel gets the image's own pages (spliced when it allows).
            status = fuse_lowlevel_notify_store(session, job.ino, offset,
                                                image_extents_bufvec(fs.fd, extents, storage),
                                                FUSE_BUF_SPLICE_NONBLOCK);
        } else {
            auto got = static_cast<sqfs_off_t>(length);
            if (sqfs_read_range(&fs, &job.inode, offset, &got, buffer.data()) != SQFS_OK ||
                got <= 0) {
                return false;  // the serving thread reports broken images; here it just stops
            }
            length = static_cast<uint64_t>(got);
            fuse_bufvec data = FUSE_BUFVEC_INIT(length);
            data.buf[0].mem = buffer.data();
            // From memory a plain write is one copy; splicing would add a copy into a pipe.
            status =
                fuse_lowlevel_notify_store(session, job.ino, offset, &data, FUSE_BUF_NO_SPLICE);
        }
        // A failure (the kernel forgot the inode, the connection ended) just ends the job: the
        // kernel sends read requests for whatever it lacks.
        if (status != 0) return false;
        job.offset += length;
        return job.offset < job.end;
    }
};

SquashfsPrefetcher::SquashfsPrefetcher(int image_fd, fuse_session* session, PrefetchLimits limits)
    : state_(std::make_shared<State>()) {
    state_->image_fd = image_fd;
    state_->session = session;
    state_->limits = limits;
    state_->budget_left = limits.total_bytes;
    std::thread([state = state_] { state->run(); }).detach();
}

SquashfsPrefetcher::~SquashfsPrefetcher() {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
    state_->wake.notify_one();
}

void SquashfsPrefetcher::file_read(fuse_ino_t ino, const sqfs_inode& inode, uint64_t read_end) {
    state_->enqueue(ino, inode, read_end);
}

}  // namespace sqbox

#include "image/squashfs_prefetch.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "image/program_interpreter.h"
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

// The serving thread's inode number for the mount's root directory (FUSE_ROOT_ID).
constexpr fuse_ino_t kRootInode = 1;

// Names nested deeper than this are not followed back to the root (a loop would be a bug).
constexpr int kMaxDepth = 256;

// Names remembered for finding files by path: about 100 bytes each. A payload that looks up
// every file of a huge image (ls -lR) would otherwise grow the server without bound; past this,
// files looked up later are simply not read ahead.
constexpr size_t kMaxNames = size_t{1} << 16;

}  // namespace

struct SquashfsPrefetcher::State {
    struct Job {
        std::string path;
        uint64_t offset;
        uint64_t end;
        UniqueFd file;  // opened by the worker on its first chunk
    };

    std::string mount_point;
    std::vector<std::string> warm_paths;

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
        warm_up();
        // A lower priority (raising one's own nice value needs no privilege): on a busy machine
        // the serving thread and the payloads go first. (Not for the warm-up: init is waiting.)
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWorkerNice);
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
            if (read_ahead_chunk(job)) active.push_back(std::move(job));
        }
    }

    // Resolved as in the sandbox (absolute symlinks stay inside the image) and only within the
    // FUSE mount, which is nodev: nothing but the image's own files is ever opened. O_NONBLOCK:
    // a FIFO does not block the open. Failures (missing names included) are the point or
    // harmless.
    // The interpreter of an executable on the list (a program's dynamic loader, a script's
    // shell, that shell's loader) joins it; at most this many, so that a chain of scripts
    // cannot keep the warm-up going.
    static constexpr size_t kMaxInterpreters = 4;

    void warm_up() const {
        UniqueFd root(::open(mount_point.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!root) return;
        open_how how{};
        how.flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
        how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS;
        std::vector<std::string> paths = warm_paths;
        const size_t limit = paths.size() + kMaxInterpreters;
        for (size_t i = 0; i < paths.size(); ++i) {
            UniqueFd file(static_cast<int>(
                ::syscall(SYS_openat2, root.get(), paths[i].c_str(), &how, sizeof how)));
            struct stat info {};
            if (!file || ::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
            if ((info.st_mode & 0111) != 0 && paths.size() < limit) {
                std::string head(kProgramHeadBytes, '\0');
                const ssize_t got = ::pread(file.get(), head.data(), head.size(), 0);
                head.resize(got > 0 ? static_cast<size_t>(got) : 0);
                if (std::optional<std::string> interpreter = program_interpreter(head)) {
                    paths.push_back(std::move(*interpreter));
                }
            }
            // The start of the file is what exec or a parser reads first; the server's read
            // hook then queues the rest as for any other read.
            (void)::readahead(file.get(), 0, kChunkBytes);
        }
    }

    // Asks the kernel to read the next chunk of `job`; true if the job has more to do. Any
    // failure just ends the job: the payload's own reads still work.
    bool read_ahead_chunk(Job& job) const {
        if (!job.file) {
            const std::string path = mount_point + job.path;
            job.file.reset(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY));
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

SquashfsPrefetcher::SquashfsPrefetcher(std::string mount_point, PrefetchLimits limits,
                                       std::vector<std::string> warm_paths)
    : limits_(limits), budget_left_(limits.total_bytes), state_(std::make_shared<State>()) {
    state_->mount_point = std::move(mount_point);
    state_->warm_paths = std::move(warm_paths);
    std::thread([state = state_] { state->run(); }).detach();
}

SquashfsPrefetcher::~SquashfsPrefetcher() {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
    state_->wake.notify_one();
}

void SquashfsPrefetcher::entry_found(fuse_ino_t parent, const char* name, fuse_ino_t ino) {
    // The first name wins for hard links: any path to the inode will do.
    if (names_.size() < kMaxNames) names_.try_emplace(ino, Name{parent, name});
}

std::string SquashfsPrefetcher::path_of(fuse_ino_t ino) const {
    std::vector<const std::string*> parts;
    for (int depth = 0; ino != kRootInode; ++depth) {
        auto found = names_.find(ino);
        if (found == names_.end() || depth == kMaxDepth) return "";
        parts.push_back(&found->second.name);
        ino = found->second.parent;
    }
    std::string path;
    for (auto part = parts.rbegin(); part != parts.rend(); ++part) path += "/" + **part;
    return path;
}

void SquashfsPrefetcher::file_read(fuse_ino_t ino, uint64_t file_size, uint64_t read_end) {
    if (read_end >= file_size || budget_left_ == 0 || !queued_.insert(ino).second) return;
    std::string path = path_of(ino);
    if (path.empty()) return;
    const uint64_t length = std::min({file_size - read_end, limits_.per_file_bytes, budget_left_});
    budget_left_ -= length;
    state_->enqueue(std::move(path), read_end, read_end + length);
}

}  // namespace sqbox

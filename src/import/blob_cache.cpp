#include "import/blob_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

namespace {
constexpr mode_t kBlobMode = 0640;  // enroot's mode for its cached layers
}

BlobCache::BlobCache(const std::filesystem::path& cache_dir)
    : blobs_(cache_dir / "blobs" / "sha256") {}

std::filesystem::path BlobCache::path_of(const std::string& digest) const {
    return blobs_ / digest.substr(digest.find(':') + 1);
}

bool BlobCache::contains(const std::string& digest) const {
    struct stat status {};
    return ::stat(path_of(digest).c_str(), &status) == 0 && S_ISREG(status.st_mode);
}

BlobCache::Pending BlobCache::begin(const std::string& digest) const {
    make_directories(std::filesystem::absolute(blobs_).string(), 0700);
    const std::filesystem::path final_path = path_of(digest);
    int fd = ::open(blobs_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, kBlobMode);
    if (fd >= 0) return Pending(UniqueFd(fd), {}, final_path);
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
        throw system_error("cannot create a file in the cache " + blobs_.string());
    }
    std::string name =
        (blobs_ / ("." + final_path.filename().string() + ".partial.XXXXXX")).string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd < 0) throw system_error("cannot create a file in the cache " + blobs_.string());
    if (::fchmod(fd, kBlobMode) != 0) {
        const int err = errno;
        (void)::unlink(name.c_str());  // ours, and about to be abandoned
        (void)::close(fd);
        throw system_error("cannot set the mode of " + name, err);
    }
    return Pending(UniqueFd(fd), name, final_path);
}

BlobCache::Pending::~Pending() {
    // A temporary never committed is removed; an unnamed file vanishes with its descriptor.
    if (!temporary_.empty()) (void)::unlink(temporary_.c_str());
}

void BlobCache::Pending::commit() {
    if (::fsync(fd_.get()) != 0) throw system_error("cannot write " + final_.string());
    if (temporary_.empty()) {
        const std::string self = "/proc/self/fd/" + std::to_string(fd_.get());
        if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, final_.c_str(), AT_SYMLINK_FOLLOW) != 0 &&
            errno != EEXIST) {
            throw system_error("cannot store " + final_.string());
        }
    } else {
        if (::rename(temporary_.c_str(), final_.c_str()) != 0) {
            throw system_error("cannot store " + final_.string());
        }
        temporary_.clear();
    }
    fd_.reset();
}

}  // namespace sqbox

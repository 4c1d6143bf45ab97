#include "warm_up/list_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string_view>

#include "image/image_paths.h"
#include "image/squashfs_guards.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/stable_hash.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// How much of each end of the image goes into its list's name: the superblock at the start,
// the ends of the tables (ids, fragments, lookup) at the end. A few KiB, not more: every start
// of a .sqsh image computes the name, and hashing 64 KiB from each end cost 0.2 ms.
constexpr size_t kKeyBytes = size_t{4} << 10;

// A list file larger than this is not one sqbox wrote.
constexpr size_t kMaxListFileBytes = size_t{32} << 20;
// An image's own list is read on every start: a few KiB for a program's start-up, and never
// more than this.
constexpr size_t kMaxImageListFileBytes = size_t{1} << 20;

std::string parent_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) throw Error("bad warm-up list path " + path);
    return path.substr(0, slash);
}

}  // namespace

void check_private_directory(const std::string& directory) {
    struct stat info {};
    if (::lstat(directory.c_str(), &info) != 0) throw system_error("cannot use " + directory);
    if (!S_ISDIR(info.st_mode) || info.st_uid != ::geteuid() || (info.st_mode & 022) != 0) {
        throw Error(directory +
                    " is not a directory of yours that only you can write; warm-up lists are "
                    "kept only in such a directory");
    }
}

std::string warm_up_list_name(int image_fd) {
    struct stat info {};
    if (::fstat(image_fd, &info) != 0) throw system_error("cannot stat the image");
    const auto size = static_cast<uint64_t>(info.st_size);
    std::string head(static_cast<size_t>(std::min<uint64_t>(size, kKeyBytes)), '\0');
    std::string tail = head;
    if (::pread(image_fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()) ||
        ::pread(image_fd, tail.data(), tail.size(), static_cast<off_t>(size - tail.size())) !=
            static_cast<ssize_t>(tail.size())) {
        throw system_error("cannot read the image");
    }
    uint64_t hash = stable_hash(head);
    hash = stable_hash(tail, hash);
    hash = stable_hash(std::string_view(reinterpret_cast<const char*>(&size), sizeof size), hash);
    char name[17];
    (void)std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(hash));
    return name;
}

std::optional<std::vector<WarmUpName>> load_warm_up_list(const std::string& path) {
    const std::string directory = parent_of(path);
    UniqueFd file(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file) {
        if (errno == ENOENT) return std::vector<WarmUpName>{};
        if (errno == ELOOP) return std::nullopt;  // a symlink: not a list sqbox wrote
        throw system_error("cannot open " + path);
    }
    check_private_directory(directory);
    struct stat info {};
    if (::fstat(file.get(), &info) != 0) throw system_error("cannot stat " + path);
    if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) > kMaxListFileBytes) {
        return std::nullopt;
    }
    return decode_warm_up_list(read_all(file.get(), path));
}

std::optional<std::vector<WarmUpName>> load_image_warm_up_list(sqfs* fs) {
    std::optional<std::vector<ImagePathStep>> steps = resolve_image_path(fs, kImageWarmUpListPath);
    if (!steps || steps->empty()) return std::vector<WarmUpName>{};
    struct stat info {};
    if (sqfs_stat(fs, &steps->back().inode, &info) != SQFS_OK || !S_ISREG(info.st_mode) ||
        static_cast<uint64_t>(info.st_size) > kMaxImageListFileBytes) {
        return std::nullopt;
    }
    std::string data(static_cast<size_t>(info.st_size), '\0');
    auto length = static_cast<sqfs_off_t>(data.size());
    if (checked_read_range(fs, &steps->back().inode, 0, &length, data.data()) != SQFS_OK ||
        length != static_cast<sqfs_off_t>(data.size())) {
        return std::nullopt;
    }
    return decode_warm_up_list(data);
}

SavedWarmUpList add_to_warm_up_list(const std::string& path,
                                    const std::vector<WarmUpName>& learned) {
    const std::string directory = parent_of(path);
    make_directories(directory, 0700);
    check_private_directory(directory);
    UniqueFd lock = lock_file(directory + "/.lock");
    // Read again under the lock: another learning run may have saved since this one started.
    const std::vector<WarmUpName> current =
        load_warm_up_list(path).value_or(std::vector<WarmUpName>{});
    const std::vector<WarmUpName> merged = merge_warm_up_names(current, learned);
    // One fixed name: every writer holds the lock, so one left by a writer that was killed is
    // simply overwritten.
    const std::string temporary = path + ".tmp";
    try {
        write_file_at(AT_FDCWD, temporary, encode_warm_up_list(merged), O_NOFOLLOW, 0600);
        if (::rename(temporary.c_str(), path.c_str()) != 0) {
            throw system_error("cannot save the warm-up list " + path);
        }
    } catch (const Error&) {
        (void)::unlink(temporary.c_str());  // a full disk leaves nothing half-written behind
        throw;
    }
    return {merged.size(), merged.size() - std::min(merged.size(), current.size())};
}

}  // namespace sqbox

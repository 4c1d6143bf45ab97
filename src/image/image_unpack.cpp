#include "image/image_unpack.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>
#include <vector>

#include "image/squashfs_guards.h"
#include "security/confined_work.h"
#include "util/errors.h"
#include "util/file_tree.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr const char* kStampHeader = "sqbox-unpacked-image 1\n";
constexpr size_t kMaxStampBytes = 4096;
constexpr size_t kCopyChunkBytes = size_t{128} << 10;
constexpr size_t kMaxSymlinkBytes = 4095;  // as the kernel bounds a symlink's target
// A temporary entry no run holds is removed once it is this old: one a run has only just
// created is not locked yet.
constexpr int64_t kLeftoverAgeSeconds = 60;

std::string format_bytes(uint64_t bytes) {
    char text[32];
    (void)std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
    return text;
}

// What makes the entry: the image file as it is on disk. Rewritten in place, it gets new times;
// replaced, a new inode. Used as the entry's name, so no two images share one.
std::string image_identity(int image_fd) {
    struct stat image {};
    if (::fstat(image_fd, &image) != 0) throw system_error("cannot stat the image");
    char text[160];
    (void)std::snprintf(
        text, sizeof text, "%" PRIx64 "-%" PRIx64 "-%" PRIx64 "-%llx.%09ld-%llx.%09ld",
        static_cast<uint64_t>(image.st_dev), static_cast<uint64_t>(image.st_ino),
        static_cast<uint64_t>(image.st_size), static_cast<unsigned long long>(image.st_mtim.tv_sec),
        image.st_mtim.tv_nsec, static_cast<unsigned long long>(image.st_ctim.tv_sec),
        image.st_ctim.tv_nsec);
    return text;
}

bool plain_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// Walks the image, in the confined child: first only counting (nothing written, so an image
// past a budget costs no disk), then writing below `root_fd`.
class ImageTreeWriter {
  public:
    ImageTreeWriter(sqfs* fs, const ImageUnpackLimits& limits) : fs_(fs), limits_(limits) {}

    void count() {
        sqfs_inode root;
        if (checked_root_inode(fs_, &root) != SQFS_OK) corrupt("the root directory");
        visit(&root, -1, "", 0);
    }

    void write(int root_fd) {
        bytes_ = 0;
        entries_ = 0;
        sqfs_inode root;
        if (checked_root_inode(fs_, &root) != SQFS_OK) corrupt("the root directory");
        visit(&root, root_fd, "", 0);
        finish_directory(root_fd, &root, "/");
    }

    uint64_t bytes() const { return bytes_; }
    size_t entries() const { return entries_; }

  private:
    [[noreturn]] static void corrupt(const std::string& what) {
        throw Error("corrupt squashfs image (" + what + ")");
    }

    void visit(sqfs_inode* directory, int out_fd, const std::string& path, size_t depth) {
        if (depth > limits_.depth) {
            throw Error("directories nested deeper than " + std::to_string(limits_.depth) + " at " +
                        path);
        }
        sqfs_dir dir;
        if (sqfs_dir_open(fs_, directory, &dir, 0) != SQFS_OK) corrupt("directory " + path + "/");
        DirEntryBuffer entry;
        sqfs_err err = SQFS_OK;
        while (sqfs_dir_next(fs_, &dir, entry.get(), &err)) {
            if (!entry.name_ok()) corrupt("a name in " + path + "/");
            const std::string name(sqfs_dentry_name(entry.get()),
                                   sqfs_dentry_name_size(entry.get()));
            if (!plain_name(name)) corrupt("the name '" + name + "' in " + path + "/");
            const std::string child_path = path + "/" + name;
            if (++entries_ > limits_.entries) {
                throw Error("it holds more than " + std::to_string(limits_.entries) + " names");
            }
            sqfs_inode child;
            struct stat st {};
            if (checked_inode_get(fs_, &child, sqfs_dentry_inode(entry.get())) != SQFS_OK ||
                sqfs_stat(fs_, &child, &st) != SQFS_OK) {
                corrupt(child_path);
            }
            if (S_ISDIR(st.st_mode)) {
                if (out_fd < 0) {
                    visit(&child, -1, child_path, depth + 1);
                    continue;
                }
                if (::mkdirat(out_fd, name.c_str(), 0700) != 0) {
                    throw system_error("cannot create " + child_path);
                }
                UniqueFd made(::openat(out_fd, name.c_str(),
                                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                if (!made) throw system_error("cannot open " + child_path);
                visit(&child, made.get(), child_path, depth + 1);
                finish_directory(made.get(), &child, child_path);
            } else if (S_ISREG(st.st_mode)) {
                const auto size = static_cast<uint64_t>(st.st_size);
                if (size > limits_.total_bytes || bytes_ + size > limits_.total_bytes) {
                    throw Error("it holds more than " + format_bytes(limits_.total_bytes) +
                                " of files (" + child_path + " reaches past it)");
                }
                bytes_ += size;
                if (out_fd >= 0) write_file(out_fd, name, &child, st, child_path);
            } else if (S_ISLNK(st.st_mode)) {
                if (out_fd >= 0) write_symlink(out_fd, name, &child, child_path);
            }
            // Devices, FIFOs and sockets are left out: the sandbox has its own /dev.
        }
        if (err != SQFS_OK) corrupt("directory " + path + "/");
    }

    void write_file(int parent, const std::string& name, sqfs_inode* inode, const struct stat& st,
                    const std::string& path) {
        UniqueFd out(::openat(parent, name.c_str(),
                              O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!out) throw system_error("cannot create " + path);
        buffer_.resize(kCopyChunkBytes);
        const auto size = static_cast<uint64_t>(st.st_size);
        for (uint64_t offset = 0; offset < size;) {
            auto length =
                static_cast<sqfs_off_t>(std::min<uint64_t>(kCopyChunkBytes, size - offset));
            if (checked_read_range(fs_, inode, static_cast<sqfs_off_t>(offset), &length,
                                   buffer_.data()) != SQFS_OK ||
                length <= 0) {
                corrupt("the contents of " + path);
            }
            if (!write_all(out.get(), buffer_.data(), static_cast<size_t>(length))) {
                throw system_error("cannot write " + path);
            }
            offset += static_cast<uint64_t>(length);
        }
        set_attributes(out.get(), st, path);
    }

    void write_symlink(int parent, const std::string& name, sqfs_inode* inode,
                       const std::string& path) {
        // The length was bounded by checked_inode_get; bounded again before the buffer is sized.
        size_t size = 0;
        if (sqfs_readlink(fs_, inode, nullptr, &size) != SQFS_OK || size > kMaxSymlinkBytes) {
            corrupt("the symlink " + path);
        }
        std::string target(size + 1, '\0');
        size = target.size();
        if (sqfs_readlink(fs_, inode, target.data(), &size) != SQFS_OK) {
            corrupt("the symlink " + path);
        }
        target.resize(std::strlen(target.c_str()));
        if (target.empty()) corrupt("the symlink " + path);
        // Stored as it is, never followed: nothing here resolves a path through the tree.
        if (::symlinkat(target.c_str(), parent, name.c_str()) != 0) {
            throw system_error("cannot create " + path);
        }
    }

    void finish_directory(int fd, sqfs_inode* inode, const std::string& path) {
        struct stat st {};
        if (sqfs_stat(fs_, inode, &st) != SQFS_OK) corrupt(path);
        set_attributes(fd, st, path);
    }

    // Without setuid and setgid: nothing of the image becomes either in the caller's cache.
    static void set_attributes(int fd, const struct stat& image, const std::string& path) {
        set_unpacked_attributes(fd, image, 01777, path);
    }

    sqfs* fs_;
    ImageUnpackLimits limits_;
    uint64_t bytes_ = 0;
    size_t entries_ = 0;
    std::vector<char> buffer_;
};

void check_no_xattrs(const std::string& path) {
    const ssize_t size = ::llistxattr(path.c_str(), nullptr, 0);
    if (size > 0 || (size < 0 && errno != ENOTSUP)) {
        throw Error(path + " has extended attributes");
    }
}

// The entry at `path` locked (shared) if it is complete and made from `identity`.
std::optional<UnpackedImage> open_entry(const std::string& path, const std::string& identity) {
    UniqueFd entry(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!entry) return std::nullopt;
    if (::flock(entry.get(), LOCK_SH) != 0) throw system_error("cannot lock " + path);
    // Still the entry of that name (not removed by another run between open and lock)?
    struct stat opened {};
    struct stat named {};
    if (::fstat(entry.get(), &opened) != 0 || ::lstat(path.c_str(), &named) != 0 ||
        opened.st_dev != named.st_dev || opened.st_ino != named.st_ino) {
        return std::nullopt;
    }
    UniqueFd stamp_fd(
        ::openat(entry.get(), "stamp", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!stamp_fd) return std::nullopt;
    std::string stamp;
    try {
        stamp = read_bounded_regular_file(stamp_fd.get(), kMaxStampBytes, path + "/stamp");
    } catch (const Error&) {
        return std::nullopt;
    }
    const std::string prefix = std::string(kStampHeader) + "image " + identity + "\n";
    unsigned long long bytes = 0;
    unsigned long long entries = 0;
    if (!stamp.starts_with(prefix) ||
        std::sscanf(stamp.c_str() + prefix.size(), "unpacked %llu %llu\n", &bytes, &entries) != 2) {
        return std::nullopt;
    }
    UnpackedImage found;
    found.root = path + "/root";
    found.bytes = bytes;
    found.entries = static_cast<size_t>(entries);
    found.lock = std::move(entry);
    return found;
}

// Removes what no run holds: leftovers of runs that died while unpacking, and the oldest entries
// beyond kMaxUnpackedImages. A run using an entry holds a shared lock on it; one making an entry
// holds an exclusive lock on its temporary directory.
void remove_unused_entries(const std::string& directory, const std::string& keep) {
    std::vector<std::pair<int64_t, std::string>> entries;  // (made, name)
    std::vector<std::string> leftovers;
    const bool listed = for_each_directory_entry(directory, [&](int, const std::string& name) {
        if (name == keep) return;
        if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos) {
            // Not one a run has just made and is about to lock.
            struct stat made {};
            if (::lstat((directory + "/" + name).c_str(), &made) == 0 &&
                made.st_mtime < ::time(nullptr) - kLeftoverAgeSeconds) {
                leftovers.push_back(name);
            }
            return;
        }
        struct stat stamp {};
        const std::string stamp_path = directory + "/" + name + "/stamp";
        const int64_t made =
            ::lstat(stamp_path.c_str(), &stamp) == 0 ? static_cast<int64_t>(stamp.st_mtime) : 0;
        entries.emplace_back(made, name);
    });
    if (!listed) return;
    std::sort(entries.begin(), entries.end());
    const size_t excess =
        entries.size() + 1 > kMaxUnpackedImages ? entries.size() + 1 - kMaxUnpackedImages : 0;
    for (size_t i = 0; i < excess; ++i) leftovers.push_back(entries[i].second);
    for (const auto& name : leftovers) {
        const std::string path = directory + "/" + name;
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!fd || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // in use
        // Out of the way first, so that no run opens it while it is being removed.
        std::string doomed = path;
        if (name.find(".old.") == std::string::npos) {
            doomed = path + ".old." + std::to_string(::getpid());
            if (::rename(path.c_str(), doomed.c_str()) != 0) continue;
        }
        fd.reset();
        try {
            remove_tree(doomed);
        } catch (const Error&) {  // best effort: the next run tries again
        }
    }
}

}  // namespace

void set_unpacked_attributes(int fd, const struct stat& image, mode_t mode_mask,
                             const std::string& what) {
    const timespec times[2] = {image.st_mtim, image.st_mtim};
    if (::fchown(fd, static_cast<uid_t>(-1), ::getegid()) != 0 ||
        ::fchmod(fd, image.st_mode & mode_mask) != 0 || ::futimens(fd, times) != 0) {
        throw system_error("cannot set the attributes of " + what);
    }
}

std::string unpack_image_tree(sqfs* fs, int root_fd, const ImageUnpackLimits& limits) {
    ImageTreeWriter writer(fs, limits);
    writer.count();
    writer.write(root_fd);
    return std::to_string(writer.bytes()) + " " + std::to_string(writer.entries());
}

std::pair<uint64_t, size_t> check_unpacked_tree(const std::string& root,
                                                const ImageUnpackLimits& limits) {
    uint64_t bytes = 0;
    size_t entries = 0;
    std::vector<std::pair<std::string, size_t>> pending = {{"", 0}};  // relative path, depth
    std::vector<std::pair<std::string, mode_t>> opened;  // closed directories opened, in order
    while (!pending.empty()) {
        const std::string relative = std::move(pending.back().first);
        const size_t depth = pending.back().second;
        pending.pop_back();
        const std::string path = relative.empty() ? root : root + "/" + relative;
        struct stat directory {};
        if (::lstat(path.c_str(), &directory) != 0) throw system_error("stat " + path);
        if (!S_ISDIR(directory.st_mode) || (directory.st_mode & (S_ISUID | S_ISGID)) != 0) {
            throw Error(path + " is not a directory sqbox makes");
        }
        check_no_xattrs(path);
        if ((directory.st_mode & 0700) != 0700) {
            if (::chmod(path.c_str(), (directory.st_mode & 07777) | 0700) != 0) {
                throw system_error("cannot open " + path);
            }
            opened.emplace_back(path, directory.st_mode & 07777);
        }
        const bool listed = for_each_directory_entry(path, [&](int, const std::string& name) {
            if (++entries > limits.entries) throw Error("too many entries in " + root);
            const std::string child = relative.empty() ? name : relative + "/" + name;
            const std::string child_path = root + "/" + child;
            struct stat st {};
            if (::lstat(child_path.c_str(), &st) != 0) throw system_error("stat " + child_path);
            if (S_ISDIR(st.st_mode)) {
                if (depth + 1 > limits.depth) throw Error("too deep a tree in " + root);
                pending.emplace_back(child, depth + 1);
                return;
            }
            if (S_ISLNK(st.st_mode)) return;
            const auto size = static_cast<uint64_t>(st.st_size);
            if (!S_ISREG(st.st_mode) || st.st_nlink != 1 ||
                (st.st_mode & (S_ISUID | S_ISGID)) != 0 || size > limits.total_bytes ||
                bytes + size > limits.total_bytes) {
                throw Error(child_path + " is not a file sqbox unpacks");
            }
            check_no_xattrs(child_path);
            bytes += size;
        });
        if (!listed) throw system_error("cannot list " + path);
    }
    for (auto it = opened.rbegin(); it != opened.rend(); ++it) {
        if (::chmod(it->first.c_str(), it->second) != 0) throw system_error("chmod " + it->first);
    }
    return {bytes, entries};
}

UnpackedImage unpack_image(sqfs* fs, int image_fd, const std::string& image_path,
                           const std::string& cache_directory, const ImageUnpackLimits& limits) {
    if (cache_directory.empty()) {
        throw Error("no cache directory to unpack " + image_path +
                    " into: set SQBOX_CACHE_DIR or HOME");
    }
    const std::string directory = cache_directory + "/images";
    make_private_directory(directory);
    const std::string identity = image_identity(image_fd);
    const std::string entry = directory + "/" + identity;
    // Twice at most: another run may finish the same entry first, and then it is used.
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (std::optional<UnpackedImage> found = open_entry(entry, identity)) {
            // Leftovers of runs killed while unpacking go, whichever run comes next.
            remove_unused_entries(directory, identity);
            return std::move(*found);
        }
        std::string temporary = entry + ".tmp.XXXXXX";
        if (::mkdtemp(temporary.data()) == nullptr) {
            throw system_error("cannot create " + temporary);
        }
        try {
            UniqueFd made(
                ::open(temporary.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!made || ::flock(made.get(), LOCK_EX) != 0) {
                throw system_error("cannot open " + temporary);
            }
            if (::mkdirat(made.get(), "root", 0700) != 0) throw system_error("cannot create root");
            UniqueFd root(
                ::openat(made.get(), "root", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!root) throw system_error("cannot open " + temporary + "/root");
            ConfinedLimits confined;
            confined.file_size_bytes = std::max<uint64_t>(limits.total_bytes, 1);
            confined.time_limit = limits.time_limit;
            confined.make_symlinks = true;
            confined.stop_signals = limits.stop_signals;
            const int root_fd = root.get();
            (void)run_confined(
                root_fd, {image_fd}, [&] { return unpack_image_tree(fs, root_fd, limits); },
                confined);
            root.reset();
            if (image_identity(image_fd) != identity) {
                throw Error("the image changed while it was being unpacked");
            }
            const auto [bytes, entries] = check_unpacked_tree(temporary + "/root", limits);
            write_file_at(made.get(), "stamp",
                          std::string(kStampHeader) + "image " + identity + "\nunpacked " +
                              std::to_string(bytes) + " " + std::to_string(entries) + "\n",
                          O_EXCL | O_NOFOLLOW, 0600);
            if (::rename(temporary.c_str(), entry.c_str()) != 0) {
                if (errno != EEXIST && errno != ENOTEMPTY) {
                    throw system_error("cannot rename " + temporary + " to " + entry);
                }
                made.reset();
                remove_tree(temporary);  // another run made it first
                continue;
            }
            // Ours now: shared, as every run using it holds it.
            if (::flock(made.get(), LOCK_SH) != 0) throw system_error("cannot lock " + entry);
            UnpackedImage unpacked;
            unpacked.root = entry + "/root";
            unpacked.made = true;
            unpacked.bytes = bytes;
            unpacked.entries = entries;
            unpacked.lock = std::move(made);
            remove_unused_entries(directory, identity);
            return unpacked;
        } catch (const Error&) {
            try {
                remove_tree(temporary);
            } catch (const Error&) {  // the first error is the one to report
            }
            throw;
        }
    }
    throw Error("cannot use " + entry + ": another run keeps replacing it");
}

}  // namespace sqbox

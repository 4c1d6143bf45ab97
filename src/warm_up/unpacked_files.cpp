#include "warm_up/unpacked_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "image/image_paths.h"
#include "image/image_unpack.h"
#include "image/squashfs_guards.h"
#include "security/confined_work.h"
#include "util/errors.h"
#include "util/file_tree.h"
#include "util/files.h"
#include "util/stable_hash.h"
#include "warm_up/list_store.h"

namespace sqbox {
namespace {

// The stamp's first line, as entries already made on disk have it (from when the unpacked files
// were called hot files): another header would make every cache start afresh.
constexpr const char* kStampHeader = "sqbox-hot-files 2\n";
constexpr size_t kMaxStampBytes = 4096;
// The image's list as kept in the entry: what load_image_warm_up_list accepts, plus its header.
constexpr size_t kMaxImageListBytes = (size_t{1} << 20) + 64;
// One data block of a common image (the block cache reads whole blocks anyway).
constexpr size_t kCopyChunkBytes = size_t{128} << 10;
// How long a run waits for another one that is making an entry (a confined unpacking ends
// within its own time limit) before it goes on without.
constexpr int kLockWaitMs = 3000;

std::string format_time(const timespec& time) {
    char text[48];
    (void)std::snprintf(text, sizeof text, "%lld.%09ld", static_cast<long long>(time.tv_sec),
                        time.tv_nsec);
    return text;
}

// What the entry is made from: the image file as it is on disk (rewriting it in place changes
// its times, replacing it changes its inode) and the list, the caller's (its files, in order) or
// the image's own.
std::string stamp_prefix(int image_fd, const std::vector<WarmUpName>& learned) {
    struct stat image {};
    if (::fstat(image_fd, &image) != 0) throw system_error("cannot stat the image");
    std::string list = "image";
    if (!learned.empty()) {
        uint64_t hash = kStableHashSeed;
        for (const auto& name : learned) {
            if (name.kind != WarmUpKind::kRead) continue;
            hash = stable_hash(std::string_view(name.path.c_str(), name.path.size() + 1), hash);
        }
        char text[32];
        (void)std::snprintf(text, sizeof text, "learned %016" PRIx64, hash);
        list = text;
    }
    char text[256];
    (void)std::snprintf(text, sizeof text, "image %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %s\n",
                        static_cast<uint64_t>(image.st_dev), static_cast<uint64_t>(image.st_ino),
                        static_cast<uint64_t>(image.st_size), format_time(image.st_mtim).c_str(),
                        format_time(image.st_ctim).c_str());
    return std::string(kStampHeader) + text + "list " + list + "\n";
}

// The small regular file `name` in the directory `dir`, or nullopt.
std::optional<std::string> read_entry_file(int dir, const char* name, size_t max_bytes) {
    UniqueFd file(::openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file) return std::nullopt;
    try {
        return read_bounded_regular_file(file.get(), max_bytes, name);
    } catch (const Error&) {
        return std::nullopt;
    }
}

// The entry at `path` if its stamp starts with `prefix` (and it holds what that stamp says):
// read through one descriptor of the entry, so that stamp, list and tree are one entry's even
// if another run replaces it meanwhile.
std::optional<UnpackedFiles> read_entry(const std::string& path, const std::string& prefix,
                                        bool image_list) {
    UniqueFd entry(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!entry) return std::nullopt;
    std::optional<std::string> stamp = read_entry_file(entry.get(), "stamp", kMaxStampBytes);
    if (!stamp || !stamp->starts_with(prefix)) return std::nullopt;
    const std::string status = stamp->substr(prefix.size());
    UnpackedFiles found;
    if (status.starts_with("failed ")) {
        found.failure = status.substr(7, status.find('\n') - 7);
        return found;
    }
    unsigned long long files = 0;
    unsigned long long bytes = 0;
    if (std::sscanf(status.c_str(), "unpacked %llu %llu\n", &files, &bytes) != 2) {
        return std::nullopt;
    }
    if (image_list) {
        std::optional<std::string> list =
            read_entry_file(entry.get(), "image-list", kMaxImageListBytes);
        std::optional<std::vector<WarmUpName>> names;
        if (list) names = decode_warm_up_list(*list);
        if (!names) return std::nullopt;
        found.image_names = std::move(*names);
    }
    found.files = static_cast<size_t>(files);
    found.bytes = bytes;
    if (files > 0) {
        found.tree_fd.reset(
            ::openat(entry.get(), "tree", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!found.tree_fd) return std::nullopt;
        found.tree = path + "/tree";
    }
    return found;
}

// Whether a file of `file`'s status is one sqbox unpacks (see the header), with `bytes` already
// in the tree: the builder's choice and the launcher's check of what the builder made.
bool unpackable(const struct stat& file, uint64_t bytes, const UnpackedFilesLimits& limits) {
    const auto size = static_cast<uint64_t>(file.st_size);
    return S_ISREG(file.st_mode) && file.st_nlink == 1 &&
           (file.st_mode & (S_ISUID | S_ISGID)) == 0 && size <= limits.file_bytes &&
           bytes + size <= limits.total_bytes;
}

// Unpacks files into a new tree, directory by directory as their paths need them, within the
// limits' budgets. Runs in the confined child.
class TreeBuilder {
  public:
    TreeBuilder(sqfs* fs, int tree_fd, const UnpackedFilesLimits& limits)
        : fs_(fs), tree_fd_(tree_fd), limits_(limits), lookups_left_(limits.lookups) {}

    // Unpacks the file `path` resolves to, if it qualifies (see the header).
    void add(const std::string& path) {
        std::optional<std::vector<ImagePathStep>> steps =
            resolve_image_path(fs_, path, &lookups_left_);
        if (!steps || steps->empty()) return;
        struct stat file {};
        if (sqfs_stat(fs_, &steps->back().inode, &file) != SQFS_OK) return;
        if (!unpackable(file, bytes_, limits_) || created_ + steps->size() > limits_.entries) {
            return;
        }
        UniqueFd parent = open_parents(*steps);
        const std::string& name = steps->back().name;
        const std::string where = image_path_of(*steps);
        UniqueFd out(::openat(parent.get(), name.c_str(),
                              O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!out) {
            if (errno == EEXIST) return;  // two names of the list lead to one file
            throw system_error("cannot create " + where);
        }
        ++created_;
        const auto size = static_cast<uint64_t>(file.st_size);
        if (!copy_contents(&steps->back().inode, size, out.get(), where)) {
            // A file the image cannot give whole stays in the image.
            (void)::unlinkat(parent.get(), name.c_str(), 0);
            return;
        }
        set_attributes(out.get(), file, where);
        bytes_ += size;
    }

    // The image's permission bits and modification time on each directory made, now that
    // nothing more is created in them: deepest first (in reverse order of creation), so that a
    // directory the image makes unsearchable (mode 0000, say) is closed only after everything in
    // it.
    void finish() {
        for (auto made = directories_.rbegin(); made != directories_.rend(); ++made) {
            struct stat directory {};
            if (sqfs_stat(fs_, &made->second, &directory) != SQFS_OK) {
                throw Error("cannot read the image's directory /" + made->first);
            }
            UniqueFd fd(::openat(tree_fd_, made->first.c_str(),
                                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!fd) throw system_error("cannot open /" + made->first);
            set_attributes(fd.get(), directory, "/" + made->first);
        }
    }

  private:
    // The directory that holds the last step, made (0700 until finish()) where missing.
    UniqueFd open_parents(const std::vector<ImagePathStep>& steps) {
        // Not dup(): the confined child may not duplicate descriptors (security/confined_work.h).
        UniqueFd current(::openat(tree_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!current) throw system_error("cannot open the tree");
        std::string path;  // relative to the tree
        for (size_t i = 0; i + 1 < steps.size(); ++i) {
            const std::string& name = steps[i].name;
            path += (path.empty() ? "" : "/") + name;
            if (::mkdirat(current.get(), name.c_str(), 0700) == 0) {
                directories_.emplace_back(path, steps[i].inode);
                ++created_;
            } else if (errno != EEXIST) {
                throw system_error("cannot create /" + path);
            }
            UniqueFd next(::openat(current.get(), name.c_str(),
                                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!next) throw system_error("cannot open /" + path);
            current = std::move(next);
        }
        return current;
    }

    // False if the image cannot give the file's contents; throws if they cannot be written.
    bool copy_contents(sqfs_inode* inode, uint64_t size, int out, const std::string& path) {
        buffer_.resize(kCopyChunkBytes);
        for (uint64_t offset = 0; offset < size;) {
            auto length =
                static_cast<sqfs_off_t>(std::min<uint64_t>(kCopyChunkBytes, size - offset));
            if (checked_read_range(fs_, inode, static_cast<sqfs_off_t>(offset), &length,
                                   buffer_.data()) != SQFS_OK ||
                length <= 0) {
                return false;
            }
            if (!write_all(out, buffer_.data(), static_cast<size_t>(length))) {
                throw system_error("cannot write the unpacked " + path);
            }
            offset += static_cast<uint64_t>(length);
        }
        return true;
    }

    static void set_attributes(int fd, const struct stat& image, const std::string& path) {
        set_unpacked_attributes(fd, image, 07777, "the unpacked " + path);
    }

    sqfs* fs_;
    int tree_fd_;
    UnpackedFilesLimits limits_;
    size_t lookups_left_;
    size_t created_ = 0;
    std::vector<std::pair<std::string, sqfs_inode>> directories_;  // in order of creation
    std::vector<char> buffer_;
    uint64_t bytes_ = 0;  // unpacked so far
};

// No extended attributes: overlayfs would read user.overlay.* ones on a lower layer (an opaque
// directory or a whiteout hides the image's files).
void check_no_xattrs(const std::string& path) {
    const ssize_t size = ::llistxattr(path.c_str(), nullptr, 0);
    if (size > 0 || (size < 0 && errno != ENOTSUP)) {
        throw Error(path + " has extended attributes");
    }
}

UniqueFd make_empty_directory(const std::string& path) {
    remove_tree(path);
    if (::mkdir(path.c_str(), 0700) != 0) throw system_error("cannot create " + path);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) throw system_error("cannot open " + path);
    return fd;
}

// Removes the oldest entries (by when they were made) of `directory` but `keep`, so that at most
// kMaxEntries remain. Best effort: a sandbox still running on a removed tree keeps the files it
// opened and finds the rest in the image.
void remove_oldest_entries(const std::string& directory, const std::string& keep) {
    std::vector<std::pair<int64_t, std::string>> entries;  // (made, name)
    const bool listed = for_each_directory_entry(directory, [&](int, const std::string& name) {
        if (!name.ends_with(".files") || name == keep) return;
        struct stat stamp {};
        const std::string stamp_path = directory + "/" + name + "/stamp";
        const int64_t made =
            ::lstat(stamp_path.c_str(), &stamp) == 0 ? static_cast<int64_t>(stamp.st_mtime) : 0;
        entries.emplace_back(made, name);
    });
    if (!listed || entries.size() < kMaxEntries) return;
    std::sort(entries.begin(), entries.end());
    for (size_t i = 0; i + kMaxEntries <= entries.size(); ++i) {
        try {
            remove_tree(directory + "/" + entries[i].second);
        } catch (const Error&) {  // another run is at it
        }
    }
}

}  // namespace

void unpack_image_files(sqfs* fs, int entry_fd, const std::vector<WarmUpName>& learned,
                        const UnpackedFilesLimits& limits) {
    std::vector<WarmUpName> names = learned;
    if (learned.empty()) {
        // An image whose list is not one is as one without: nothing to unpack.
        names = load_image_warm_up_list(fs).value_or(std::vector<WarmUpName>{});
        write_file_at(entry_fd, "image-list", encode_warm_up_list(names), O_EXCL | O_NOFOLLOW,
                      0600);
    }
    if (::mkdirat(entry_fd, "tree", 0755) != 0) throw system_error("cannot create tree");
    UniqueFd tree(::openat(entry_fd, "tree", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!tree) throw system_error("cannot open tree");
    TreeBuilder builder(fs, tree.get(), limits);
    for (const auto& name : names) {
        if (name.kind == WarmUpKind::kRead) builder.add(name.path);
    }
    builder.finish();
}

UnpackedFilesCounts check_made_entry(const std::string& entry, bool image_list,
                                     const UnpackedFilesLimits& limits) {
    bool has_tree = false;
    const bool listed = for_each_directory_entry(entry, [&](int, const std::string& name) {
        struct stat st {};
        if (::lstat((entry + "/" + name).c_str(), &st) != 0) throw system_error("stat " + name);
        if (name == "tree" && S_ISDIR(st.st_mode)) {
            has_tree = true;
        } else if (!(name == "image-list" && image_list && S_ISREG(st.st_mode) &&
                     st.st_nlink == 1 && static_cast<size_t>(st.st_size) <= kMaxImageListBytes)) {
            throw Error("unexpected " + name + " in " + entry);
        }
    });
    if (!listed) throw system_error("cannot list " + entry);
    if (!has_tree) throw Error("no tree in " + entry);
    const std::string tree = entry + "/tree";
    UnpackedFilesCounts counts;
    size_t entries = 0;
    std::vector<std::string> pending = {""};  // directories to list, relative to the tree
    std::vector<std::pair<std::string, mode_t>> opened;  // closed directories opened, in order
    while (!pending.empty()) {
        const std::string relative = std::move(pending.back());
        pending.pop_back();
        const std::string path = relative.empty() ? tree : tree + "/" + relative;
        struct stat directory {};
        if (::lstat(path.c_str(), &directory) != 0) throw system_error("stat " + path);
        check_no_xattrs(path);
        if ((directory.st_mode & 0700) != 0700) {
            if (::chmod(path.c_str(), (directory.st_mode & 07777) | 0700) != 0) {
                throw system_error("cannot open " + path);
            }
            opened.emplace_back(path, directory.st_mode & 07777);
        }
        const bool path_listed = for_each_directory_entry(path, [&](int, const std::string& name) {
            if (++entries > limits.entries) throw Error("too many entries in " + tree);
            const std::string child = relative.empty() ? name : relative + "/" + name;
            if (child.size() >= 4096) throw Error("too long a path in " + tree);
            const std::string child_path = tree + "/" + child;
            struct stat st {};
            if (::lstat(child_path.c_str(), &st) != 0) throw system_error("stat " + child_path);
            if (S_ISDIR(st.st_mode)) {
                pending.push_back(child);
                return;
            }
            if (!unpackable(st, counts.bytes, limits)) {
                throw Error(child_path + " is not a file sqbox unpacks");
            }
            check_no_xattrs(child_path);
            ++counts.files;
            counts.bytes += static_cast<uint64_t>(st.st_size);
        });
        if (!path_listed) throw system_error("cannot list " + path);
    }
    // Deepest first, as they were made.
    for (auto it = opened.rbegin(); it != opened.rend(); ++it) {
        if (::chmod(it->first.c_str(), it->second) != 0) throw system_error("chmod " + it->first);
    }
    return counts;
}

UnpackedFiles prepare_unpacked_files(sqfs* fs, int image_fd, const std::string& directory,
                                     const std::string& key, const std::vector<WarmUpName>& learned,
                                     const UnpackedFilesLimits& limits) {
    const std::string prefix = stamp_prefix(image_fd, learned);
    const std::string entry = directory + "/" + key + ".files";
    const bool image_list = learned.empty();
    if (std::optional<UnpackedFiles> found = read_entry(entry, prefix, image_list)) {
        return std::move(*found);
    }

    make_directories(directory, 0700);
    check_private_directory(directory);
    UniqueFd lock = lock_file_within(directory + "/.lock", kLockWaitMs);
    if (!lock) {
        UnpackedFiles busy;
        busy.failure = "another run is still making it";
        return busy;
    }
    // Again under the lock: another run may have made it meanwhile.
    if (std::optional<UnpackedFiles> found = read_entry(entry, prefix, image_list)) {
        return std::move(*found);
    }

    const std::string temporary = entry + ".tmp";
    const std::string old = entry + ".old";
    UniqueFd made = make_empty_directory(temporary);
    std::string status;
    try {
        const int made_fd = made.get();
        ConfinedLimits confined;
        confined.file_size_bytes = std::max<uint64_t>(limits.file_bytes, kMaxImageListBytes);
        (void)run_confined(
            made_fd, {image_fd},
            [&] {
                unpack_image_files(fs, made_fd, learned, limits);
                return std::string();
            },
            confined);
        // Its filter forbids changing the image it reads (its status change time would show);
        // checked all the same.
        if (stamp_prefix(image_fd, learned) != prefix) {
            throw Error("the image changed while it was being unpacked");
        }
        const UnpackedFilesCounts counts = check_made_entry(temporary, image_list, limits);
        status =
            "unpacked " + std::to_string(counts.files) + " " + std::to_string(counts.bytes) + "\n";
    } catch (const Error& e) {
        // Recorded, so that later runs do not try again until the image or the list changes.
        std::string why = e.what();
        std::replace(why.begin(), why.end(), '\n', ' ');
        made.reset();
        made = make_empty_directory(temporary);
        status = "failed " + why + "\n";
    }
    try {
        write_file_at(made.get(), "stamp", prefix + status, O_EXCL | O_NOFOLLOW, 0600);
        made.reset();
        remove_tree(old);
        if (::rename(entry.c_str(), old.c_str()) != 0 && errno != ENOENT) {
            throw system_error("cannot replace " + entry);
        }
        if (::rename(temporary.c_str(), entry.c_str()) != 0) {
            throw system_error("cannot rename " + temporary + " to " + entry);
        }
    } catch (const Error&) {
        try {
            remove_tree(temporary);
        } catch (const Error&) {  // the first error is the one to report
        }
        throw;
    }
    // Sandboxes still running on the old tree keep the files they opened; names they have not
    // looked up yet come from the image instead.
    remove_tree(old);
    remove_oldest_entries(directory, key + ".files");
    std::optional<UnpackedFiles> found = read_entry(entry, prefix, image_list);
    if (!found) throw Error("cannot read " + entry + " just made");
    found->made = true;
    return std::move(*found);
}

}  // namespace sqbox

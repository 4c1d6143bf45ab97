#include "image/hot_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <vector>

#include "image/container_store.h"
#include "image/image_paths.h"
#include "image/warm_up_store.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/stable_hash.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr const char* kStampHeader = "sqbox-hot-files 1\n";
constexpr size_t kMaxStampBytes = 4096;
// One data block of a common image (the block cache reads whole blocks anyway).
constexpr size_t kCopyChunkBytes = size_t{128} << 10;

std::string format_time(const timespec& time) {
    char text[48];
    (void)std::snprintf(text, sizeof text, "%lld.%09ld", static_cast<long long>(time.tv_sec),
                        time.tv_nsec);
    return text;
}

// What the tree was made from: the image file as it is on disk (rewriting it in place changes
// its times, replacing it changes its inode) and the list's files, in order.
std::string stamp_of(int image_fd, const std::vector<std::string>& paths) {
    struct stat image {};
    if (::fstat(image_fd, &image) != 0) throw system_error("cannot stat the image");
    uint64_t hash = kStableHashSeed;
    for (const auto& path : paths) {
        hash = stable_hash(std::string_view(path.c_str(), path.size() + 1), hash);  // with NUL
    }
    char text[256];
    (void)std::snprintf(text, sizeof text,
                        "image %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %s\nlist %016" PRIx64 "\n",
                        static_cast<uint64_t>(image.st_dev), static_cast<uint64_t>(image.st_ino),
                        static_cast<uint64_t>(image.st_size), format_time(image.st_mtim).c_str(),
                        format_time(image.st_ctim).c_str(), hash);
    return std::string(kStampHeader) + text;
}

// The counts line that ends a stamp.
std::string counts_line(size_t files, uint64_t bytes) {
    return "unpacked " + std::to_string(files) + " " + std::to_string(bytes) + "\n";
}

// The tree at `tree_dir` ("KEY.files") if its stamp starts with `stamp`, with the counts it
// records.
std::optional<HotFiles> existing_tree(const std::string& tree_dir, const std::string& stamp) {
    UniqueFd file(
        ::open((tree_dir + "/stamp").c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file) return std::nullopt;
    std::string content;
    try {
        content = read_bounded_regular_file(file.get(), kMaxStampBytes, tree_dir + "/stamp");
    } catch (const Error&) {
        return std::nullopt;
    }
    if (!content.starts_with(stamp)) return std::nullopt;
    unsigned long long files = 0;
    unsigned long long bytes = 0;
    if (std::sscanf(content.c_str() + stamp.size(), "unpacked %llu %llu\n", &files, &bytes) != 2) {
        return std::nullopt;
    }
    return HotFiles{tree_dir + "/tree", static_cast<size_t>(files), bytes, false};
}

// Unpacks files into a new tree, directory by directory as their paths need them.
class TreeBuilder {
  public:
    TreeBuilder(sqfs* fs, int tree_fd, const HotFilesLimits& limits)
        : fs_(fs), tree_fd_(tree_fd), limits_(limits) {}

    // Unpacks the file `path` resolves to, if it qualifies (see the header).
    void add(const std::string& path) {
        std::optional<std::vector<ImagePathStep>> steps = resolve_image_path(fs_, path);
        if (!steps || steps->empty()) return;
        struct stat file {};
        if (sqfs_stat(fs_, &steps->back().inode, &file) != SQFS_OK) return;
        const auto size = static_cast<uint64_t>(file.st_size);
        if (!S_ISREG(file.st_mode) || file.st_nlink != 1 ||
            (file.st_mode & (S_ISUID | S_ISGID)) != 0 || size > limits_.file_bytes ||
            bytes_ + size > limits_.total_bytes) {
            return;
        }
        UniqueFd parent = open_parents(*steps);
        const std::string& name = steps->back().name;
        UniqueFd out(::openat(parent.get(), name.c_str(),
                              O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!out) {
            if (errno == EEXIST) return;  // two names of the list lead to one file
            throw system_error("cannot create " + image_path_of(*steps));
        }
        copy_contents(&steps->back().inode, size, out.get(), image_path_of(*steps));
        set_attributes(out.get(), file, image_path_of(*steps));
        ++files_;
        bytes_ += size;
    }

    // The image's permission bits and modification time on each directory made, now that
    // nothing more is created in them.
    void finish() {
        for (auto& [path, inode] : directories_) {
            struct stat directory {};
            if (sqfs_stat(fs_, &inode, &directory) != SQFS_OK) {
                throw Error("cannot read the image's directory " + path);
            }
            UniqueFd fd(::openat(tree_fd_, path.c_str() + 1,
                                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!fd) throw system_error("cannot open " + path);
            set_attributes(fd.get(), directory, path);
        }
    }

    size_t files() const { return files_; }
    uint64_t bytes() const { return bytes_; }

  private:
    // The directory that holds the last step, made (0700 until finish()) where missing.
    UniqueFd open_parents(const std::vector<ImagePathStep>& steps) {
        UniqueFd current(::dup(tree_fd_));
        if (!current) throw system_error("dup");
        std::string path;
        for (size_t i = 0; i + 1 < steps.size(); ++i) {
            const std::string& name = steps[i].name;
            path += "/" + name;
            if (::mkdirat(current.get(), name.c_str(), 0700) == 0) {
                directories_.emplace(path, steps[i].inode);
            } else if (errno != EEXIST) {
                throw system_error("cannot create " + path);
            }
            UniqueFd next(::openat(current.get(), name.c_str(),
                                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!next) throw system_error("cannot open " + path);
            current = std::move(next);
        }
        return current;
    }

    void copy_contents(sqfs_inode* inode, uint64_t size, int out, const std::string& path) {
        buffer_.resize(kCopyChunkBytes);
        for (uint64_t offset = 0; offset < size;) {
            auto length =
                static_cast<sqfs_off_t>(std::min<uint64_t>(kCopyChunkBytes, size - offset));
            if (sqfs_read_range(fs_, inode, static_cast<sqfs_off_t>(offset), &length,
                                buffer_.data()) != SQFS_OK ||
                length <= 0) {
                throw Error("cannot read " + path + " from the image");
            }
            if (!write_all(out, buffer_.data(), static_cast<size_t>(length))) {
                throw system_error("cannot write the unpacked " + path);
            }
            offset += static_cast<uint64_t>(length);
        }
    }

    static void set_attributes(int fd, const struct stat& image, const std::string& path) {
        const timespec times[2] = {image.st_mtim, image.st_mtim};
        if (::fchmod(fd, image.st_mode & 07777) != 0 || ::futimens(fd, times) != 0) {
            throw system_error("cannot set the attributes of the unpacked " + path);
        }
    }

    sqfs* fs_;
    int tree_fd_;
    HotFilesLimits limits_;
    std::map<std::string, sqfs_inode> directories_;
    std::vector<char> buffer_;
    size_t files_ = 0;
    uint64_t bytes_ = 0;
};

// Makes the tree in `temporary` (removed first if a killed run left it), stamp last.
HotFiles make_tree(sqfs* fs, const std::string& temporary, const std::string& stamp,
                   const std::vector<std::string>& paths, const HotFilesLimits& limits) {
    remove_tree(temporary);
    if (::mkdir(temporary.c_str(), 0700) != 0) throw system_error("cannot create " + temporary);
    const std::string tree = temporary + "/tree";
    if (::mkdir(tree.c_str(), 0755) != 0) throw system_error("cannot create " + tree);
    UniqueFd tree_fd(::open(tree.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!tree_fd) throw system_error("cannot open " + tree);
    TreeBuilder builder(fs, tree_fd.get(), limits);
    for (const auto& path : paths) builder.add(path);
    builder.finish();
    write_file_at(AT_FDCWD, temporary + "/stamp",
                  stamp + counts_line(builder.files(), builder.bytes()), O_EXCL | O_NOFOLLOW, 0600);
    return {tree, builder.files(), builder.bytes(), true};
}

}  // namespace

std::optional<HotFiles> prepare_hot_files(sqfs* fs, int image_fd, const std::string& directory,
                                          const std::string& key,
                                          const std::vector<WarmUpName>& names,
                                          const HotFilesLimits& limits) {
    std::vector<std::string> paths;
    for (const auto& name : names) {
        if (name.kind == WarmUpKind::kRead) paths.push_back(name.path);
    }
    if (paths.empty()) return std::nullopt;
    const std::string stamp = stamp_of(image_fd, paths);
    const std::string tree_dir = directory + "/" + key + ".files";
    auto usable = [](std::optional<HotFiles> tree) {
        return tree && tree->files > 0 ? tree : std::nullopt;
    };
    if (std::optional<HotFiles> tree = existing_tree(tree_dir, stamp)) return usable(tree);

    make_directories(directory, 0700);
    check_private_directory(directory);
    UniqueFd lock = lock_file(directory + "/.lock");
    // Again under the lock: another run may have made it meanwhile.
    if (std::optional<HotFiles> tree = existing_tree(tree_dir, stamp)) return usable(tree);
    const std::string temporary = tree_dir + ".tmp";
    const std::string old = tree_dir + ".old";
    HotFiles made;
    try {
        made = make_tree(fs, temporary, stamp, paths, limits);
        remove_tree(old);
        if (::rename(tree_dir.c_str(), old.c_str()) != 0 && errno != ENOENT) {
            throw system_error("cannot replace " + tree_dir);
        }
        if (::rename(temporary.c_str(), tree_dir.c_str()) != 0) {
            throw system_error("cannot rename " + temporary + " to " + tree_dir);
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
    made.tree = tree_dir + "/tree";
    return usable(made);
}

}  // namespace sqbox

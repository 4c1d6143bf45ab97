#include "runtime/layer_replay.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "util/errors.h"
#include "util/file_tree.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

bool is_whiteout(const struct stat& st) {
    return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0);
}

// overlayfs marks a directory that replaced a lower one (rm -r, then mkdir) opaque: nothing below
// it shows through. With userxattr (as sqbox mounts it) the mark is a user.* attribute.
bool is_opaque(int dir_fd) {
    std::array<char, 2> value{};
    const ssize_t size = ::fgetxattr(dir_fd, "user.overlay.opaque", value.data(), value.size());
    return size == 1 && value[0] == 'y';
}

UniqueFd open_directory_below(int parent, const std::string& name, const std::string& what) {
    UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) throw system_error("cannot open " + what);
    return fd;
}

std::vector<std::string> names_in(int dir_fd, const std::string& what) {
    UniqueFd listing(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!listing) throw system_error("cannot list " + what);
    std::unique_ptr<DIR, int (*)(DIR*)> stream(::fdopendir(listing.get()), ::closedir);
    if (!stream) throw system_error("cannot list " + what);
    (void)listing.release();  // the stream's now
    std::vector<std::string> names;
    errno = 0;
    while (dirent* entry = ::readdir(stream.get())) {
        std::string name = entry->d_name;
        if (name != "." && name != "..") names.push_back(std::move(name));
    }
    if (errno != 0) throw system_error("cannot list " + what);
    return names;
}

// A path for messages: the payload chose how deep and long it is.
std::string shown(const std::string& path) {
    constexpr size_t kShown = 120;
    if (path.size() <= kShown) return path.empty() ? "/" : path;
    return "..." + path.substr(path.size() - kShown);
}

void set_times_at(int dir, const std::string& name, const struct stat& st,
                  const std::string& what) {
    const std::array<timespec, 2> times = {st.st_atim, st.st_mtim};
    if (::utimensat(dir, name.c_str(), times.data(), AT_SYMLINK_NOFOLLOW) != 0) {
        throw system_error("cannot set the times of " + what);
    }
}

// Walks both trees together, iteratively, holding one directory of each whatever the depth (a
// layer is the payload's work: thousands of levels must exhaust neither descriptors nor the
// stack). A directory's own entries are applied when it is entered; its subdirectories are then
// entered one by one, and going back up re-opens ".." in both trees and checks it is the
// directory we came from.
class Replay {
  public:
    ReplaySummary run(int upper_fd, int merged_fd) {
        UniqueFd upper(::openat(upper_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        UniqueFd merged(::openat(merged_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        merged_root_ = UniqueFd(::openat(merged_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!upper || !merged || !merged_root_) {
            throw system_error("cannot open the layers to save");
        }
        data_budget_ = bytes_used_by(upper.get());
        std::vector<Level> levels;
        levels.push_back(enter({}, upper.get(), merged.get()));
        for (;;) {
            Level& level = levels.back();
            if (!level.subdirectories.empty()) {
                Subdirectory next = std::move(level.subdirectories.back());
                level.subdirectories.pop_back();
                const ino_t upper_parent = inode_of(upper.get(), path_);
                const ino_t merged_parent = inode_of(merged.get(), path_);
                const size_t parent_path_size = path_.size();
                path_.append("/").append(next.name);
                UniqueFd upper_child = open_directory_below(upper.get(), next.name, shown(path_));
                UniqueFd merged_child = open_directory_below(merged.get(), next.name, shown(path_));
                Level child = enter(std::move(next), upper_child.get(), merged_child.get());
                child.parent_path_size = parent_path_size;
                child.upper_parent = upper_parent;
                child.merged_parent = merged_parent;
                levels.push_back(std::move(child));
                upper = std::move(upper_child);
                merged = std::move(merged_child);
                continue;
            }
            if (levels.size() == 1) break;
            UniqueFd upper_parent = parent_of(upper.get(), level.upper_parent, path_);
            UniqueFd merged_parent = parent_of(merged.get(), level.merged_parent, path_);
            finish_directory(merged_parent.get(), level, path_);
            path_.resize(level.parent_path_size);
            levels.pop_back();
            upper = std::move(upper_parent);
            merged = std::move(merged_parent);
        }
        return summary_;
    }

  private:
    struct Subdirectory {
        std::string name;
        struct stat upper_stat {};
    };
    // Its name only: the path from the root is path_ while it is entered (a path per level would
    // hold memory by the square of the depth, which is the payload's choice).
    struct Level {
        Subdirectory self;
        size_t parent_path_size = 0;
        ino_t upper_parent = 0;
        ino_t merged_parent = 0;
        std::vector<Subdirectory> subdirectories;  // still to enter
    };

    // path_ with "/NAME" appended while it lives.
    class EntryPath {
      public:
        EntryPath(std::string& path, const std::string& name) : path_(path), size_(path.size()) {
            path_.append("/").append(name);
        }
        EntryPath(const EntryPath&) = delete;
        EntryPath& operator=(const EntryPath&) = delete;
        ~EntryPath() { path_.resize(size_); }

      private:
        std::string& path_;
        size_t size_;
    };

    // What the sandbox's tmpfs holds: no replay of it can need to write more data (hard links
    // aside, which are kept as links), so it bounds what saving writes to the host's disk.
    static uint64_t bytes_used_by(int tmpfs_dir) {
        struct statfs fs {};
        if (::fstatfs(tmpfs_dir, &fs) != 0) throw system_error("cannot measure what was written");
        return static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * static_cast<uint64_t>(fs.f_bsize);
    }

    // A file with more names: its first copy is remembered (as a path below the merged root, while
    // the names stay within a bound: the payload chose how many and how long they are).
    void remember_saved_copy(const struct stat& st, const std::string& path) {
        if (st.st_nlink < 2 || path.size() > PATH_MAX ||
            saved_names_bytes_ + path.size() > kSavedNamesBudget) {
            return;
        }
        const std::string relative = path.substr(1);
        saved_names_bytes_ += relative.size();
        saved_copies_.emplace(std::make_pair(st.st_dev, st.st_ino), relative);
    }

    // Another name of a file already saved becomes a hard link to its copy (a tmpfs holds any
    // number of names of one file's data: copying each would multiply it on the host's disk).
    bool link_to_saved_copy(int merged_dir, const std::string& name, const struct stat& st,
                            const std::string& path) const {
        if (st.st_nlink < 2) return false;
        const auto saved = saved_copies_.find(std::make_pair(st.st_dev, st.st_ino));
        if (saved == saved_copies_.end()) return false;
        const size_t slash = saved->second.rfind('/');
        const std::string parent =
            slash == std::string::npos ? "." : saved->second.substr(0, slash);
        const std::string base =
            slash == std::string::npos ? saved->second : saved->second.substr(slash + 1);
        open_how how{};
        how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
        how.resolve =
            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
        UniqueFd directory(static_cast<int>(
            ::syscall(SYS_openat2, merged_root_.get(), parent.c_str(), &how, sizeof how)));
        if (!directory) throw system_error("cannot link " + shown(path));
        if (::linkat(directory.get(), base.c_str(), merged_dir, name.c_str(), 0) != 0) {
            if (errno == EMLINK) return false;  // copied instead, within the data budget
            throw system_error("cannot link " + shown(path));
        }
        return true;
    }

    static ino_t inode_of(int dir, const std::string& path) {
        struct stat st {};
        if (::fstat(dir, &st) != 0) throw system_error("cannot stat " + shown(path));
        return st.st_ino;
    }

    static UniqueFd parent_of(int dir, ino_t expected, const std::string& path) {
        UniqueFd parent(::openat(dir, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        struct stat st {};
        if (!parent || ::fstat(parent.get(), &st) != 0 || st.st_ino != expected) {
            throw Error("cannot save " + shown(path) + ": the tree changed while it was saved");
        }
        return parent;
    }

    // Its mode and times last: filling it changed them, and its mode may not allow filling.
    static void finish_directory(int merged_parent, const Level& level, const std::string& path) {
        const mode_t mode = level.self.upper_stat.st_mode & 07777;
        if (::fchmodat(merged_parent, level.self.name.c_str(), mode, 0) != 0) {
            throw system_error("cannot set the mode of " + shown(path));
        }
        set_times_at(merged_parent, level.self.name, level.self.upper_stat, shown(path));
    }

    // Applies the directory's own entries; returns its level with the subdirectories to enter,
    // each already a directory of the merged tree.
    Level enter(Subdirectory self, int upper_dir, int merged_dir) {
        Level level;
        level.self = std::move(self);
        for (const std::string& name : names_in(upper_dir, shown(path_))) {
            const EntryPath entry(path_, name);
            const std::string& entry_path = path_;
            struct stat st {};
            if (::fstatat(upper_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
                throw system_error("cannot stat " + shown(entry_path));
            }
            const bool device = S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode);
            if (S_ISSOCK(st.st_mode) || (device && !is_whiteout(st))) {
                ++summary_.skipped;  // a socket means nothing once its process is gone
                continue;
            }
            ++summary_.entries;
            if (S_ISDIR(st.st_mode)) {
                prepare_subdirectory(upper_dir, merged_dir, name, entry_path);
                level.subdirectories.push_back({name, st});
                continue;
            }
            remove_tree_at(merged_dir, name, shown(entry_path));
            if (S_ISREG(st.st_mode)) {
                if (!link_to_saved_copy(merged_dir, name, st, entry_path)) {
                    copy_file(upper_dir, merged_dir, name, st, entry_path);
                    remember_saved_copy(st, entry_path);
                }
            } else if (S_ISLNK(st.st_mode)) {
                copy_symlink(upper_dir, merged_dir, name, st, entry_path);
            } else if (S_ISFIFO(st.st_mode)) {
                if (::mkfifoat(merged_dir, name.c_str(), st.st_mode & 0777) != 0) {
                    throw system_error("cannot make " + shown(entry_path));
                }
                set_times_at(merged_dir, name, st, shown(entry_path));
            }
            // A whiteout: the removal was all.
        }
        return level;
    }

    // Makes the merged tree's `name` stand for the sandbox's directory: kept where the two
    // merged, made anew where the sandbox replaced the directory or something else stood.
    static void prepare_subdirectory(int upper_dir, int merged_dir, const std::string& name,
                                     const std::string& path) {
        UniqueFd upper_child = open_directory_below(upper_dir, name, shown(path));
        struct stat existing {};
        const bool exists =
            ::fstatat(merged_dir, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0;
        if (!exists && errno != ENOENT) throw system_error("cannot stat " + shown(path));
        if (exists && S_ISDIR(existing.st_mode) && !is_opaque(upper_child.get())) return;
        if (exists) remove_tree_at(merged_dir, name, shown(path));
        if (::mkdirat(merged_dir, name.c_str(), 0700) != 0) {
            throw system_error("cannot make " + shown(path));
        }
    }

    // The data extents only: a sparse file of the sandbox's stays sparse on disk, so what is
    // written is bounded by what the sandbox's tmpfs held.
    void copy_file(int upper_dir, int merged_dir, const std::string& name, const struct stat& st,
                   const std::string& path) {
        UniqueFd source(::openat(upper_dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!source) throw system_error("cannot open " + shown(path));
        UniqueFd target(::openat(merged_dir, name.c_str(),
                                 O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!target) throw system_error("cannot create " + shown(path));
        off_t offset = 0;
        while (offset < st.st_size) {
            const off_t data = ::lseek(source.get(), offset, SEEK_DATA);
            if (data < 0 && errno == ENXIO) break;  // only a hole is left
            if (data < 0) throw system_error("cannot read " + shown(path));
            off_t hole = ::lseek(source.get(), data, SEEK_HOLE);
            if (hole < 0) throw system_error("cannot read " + shown(path));
            for (off_t at = data; at < hole;) {
                const size_t want = static_cast<size_t>(
                    std::min<off_t>(hole - at, static_cast<off_t>(buffer_.size())));
                const ssize_t got = ::pread(source.get(), buffer_.data(), want, at);
                if (got < 0) throw system_error("cannot read " + shown(path));
                if (got == 0) break;  // the file shrank: nothing more to read
                if (summary_.data_bytes + static_cast<uint64_t>(got) > data_budget_) {
                    throw Error("cannot save " + shown(path) +
                                ": more data than the sandbox's tmpfs held");
                }
                for (ssize_t done = 0; done < got;) {
                    const ssize_t put = ::pwrite(target.get(), buffer_.data() + done,
                                                 static_cast<size_t>(got - done), at + done);
                    if (put <= 0) {
                        throw system_error("cannot write " + shown(path),
                                           put == 0 ? ENOSPC : errno);
                    }
                    done += put;
                }
                at += got;
                summary_.data_bytes += static_cast<uint64_t>(got);
            }
            offset = hole;
        }
        if (::ftruncate(target.get(), st.st_size) != 0) {
            throw system_error("cannot size " + shown(path));
        }
        // Written by a payload: never setuid or setgid on the host's disk (export keeps those
        // bits only on the image's own unchanged files, SECURITY.md).
        if ((st.st_mode & (S_ISUID | S_ISGID)) != 0) ++summary_.setid_dropped;
        if (::fchmod(target.get(), st.st_mode & 01777) != 0) {
            throw system_error("cannot set the mode of " + shown(path));
        }
        const std::array<timespec, 2> times = {st.st_atim, st.st_mtim};
        if (::futimens(target.get(), times.data()) != 0) {
            throw system_error("cannot set the times of " + shown(path));
        }
    }

    void copy_symlink(int upper_dir, int merged_dir, const std::string& name, const struct stat& st,
                      const std::string& path) {
        std::vector<char> target(static_cast<size_t>(st.st_size) + 1);
        const ssize_t size = ::readlinkat(upper_dir, name.c_str(), target.data(), target.size());
        if (size < 0 || static_cast<size_t>(size) >= target.size()) {
            throw system_error("cannot read the link " + shown(path));
        }
        target[static_cast<size_t>(size)] = '\0';
        if (::symlinkat(target.data(), merged_dir, name.c_str()) != 0) {
            throw system_error("cannot make the link " + shown(path));
        }
        set_times_at(merged_dir, name, st, shown(path));
    }

    static constexpr size_t kSavedNamesBudget = size_t{16} << 20;

    ReplaySummary summary_;
    std::string path_;  // of the directory or entry at hand, from the root ("" for the root)
    UniqueFd merged_root_;
    uint64_t data_budget_ = 0;
    std::map<std::pair<dev_t, ino_t>, std::string> saved_copies_;
    size_t saved_names_bytes_ = 0;
    std::vector<char> buffer_ = std::vector<char>(size_t{1} << 17);
};

}  // namespace

ReplaySummary replay_upper_layer(int upper_fd, int merged_fd) {
    return Replay().run(upper_fd, merged_fd);
}

}  // namespace sqbox

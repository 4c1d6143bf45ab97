#include "util/file_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// Opens directory `name` below `parent` for reading, making it accessible first where needed
// (overlayfs leaves its work directory at mode 000). Invalid if it is gone already.
UniqueFd open_subdirectory(int parent, const std::string& name, const std::string& what) {
    UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd && errno == EACCES) {
        if (::fchmodat(parent, name.c_str(), 0700, 0) != 0) {
            throw system_error("cannot make " + what + " accessible");
        }
        fd.reset(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!fd && errno == ENOENT) return fd;
    if (!fd) throw system_error("cannot open " + what);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw system_error("cannot stat " + what);
    if ((st.st_mode & 0700) != 0700 && ::fchmod(fd.get(), 0700) != 0) {
        throw system_error("cannot make " + what + " writable");
    }
    return fd;
}

// Unlinks every non-directory entry of `dir`, in one listing, and returns the names of its
// subdirectories. Refuses to go into another mount.
std::vector<std::string> clear_files(int dir, dev_t device, const std::string& what) {
    UniqueFd listing(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!listing) throw system_error("cannot list " + what);
    std::unique_ptr<DIR, int (*)(DIR*)> stream(::fdopendir(listing.get()), ::closedir);
    if (!stream) throw system_error("cannot list " + what);
    (void)listing.release();
    std::vector<std::string> subdirectories;
    while (dirent* entry = ::readdir(stream.get())) {
        std::string name = entry->d_name;
        if (name == "." || name == "..") continue;
        struct stat st {};
        if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;
            throw system_error("cannot stat " + what + "/" + name);
        }
        if (S_ISDIR(st.st_mode)) {
            if (st.st_dev != device) {
                throw Error("cannot remove " + what + "/" + name + ": it is a mount point");
            }
            subdirectories.push_back(std::move(name));
        } else if (::unlinkat(dir, name.c_str(), 0) != 0 && errno != ENOENT) {
            throw system_error("cannot remove " + what + "/" + name);
        }
    }
    return subdirectories;
}

// Removes everything below the directory open at `top` (named `path` in messages).
// Iterative, with two descriptors at most whatever the depth: a layer is the payload's work,
// and a tree thousands of levels deep must not exhaust descriptors or the stack. Each directory
// is listed once (its subdirectories' names are kept until they are gone), so the work grows
// with the size of the tree, however many siblings a directory has. Going back up re-opens ".."
// and checks it is the directory we came from.
void remove_contents(UniqueFd top, const std::string& path) {
    struct stat top_stat {};
    if (::fstat(top.get(), &top_stat) != 0) throw system_error("cannot stat " + path);
    if ((top_stat.st_mode & 0700) != 0700 && ::fchmod(top.get(), 0700) != 0) {
        throw system_error("cannot make " + path + " writable");
    }
    struct Level {
        std::string name;  // of this directory in its parent
        ino_t parent_inode;
        std::vector<std::string> subdirectories;  // still to remove
    };
    std::vector<Level> levels;
    levels.push_back({"", 0, clear_files(top.get(), top_stat.st_dev, path)});
    UniqueFd current = std::move(top);
    for (;;) {
        Level& level = levels.back();
        if (!level.subdirectories.empty()) {
            const std::string next = std::move(level.subdirectories.back());
            level.subdirectories.pop_back();
            struct stat here {};
            if (::fstat(current.get(), &here) != 0) throw system_error("cannot stat in " + path);
            UniqueFd child = open_subdirectory(current.get(), next, path + "/.../" + next);
            if (!child) continue;  // gone already
            std::vector<std::string> below = clear_files(child.get(), top_stat.st_dev, path);
            levels.push_back({next, here.st_ino, std::move(below)});
            current = std::move(child);
            continue;
        }
        if (levels.size() == 1) break;
        UniqueFd parent(::openat(current.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        struct stat parent_stat {};
        if (!parent || ::fstat(parent.get(), &parent_stat) != 0 ||
            parent_stat.st_ino != level.parent_inode || parent_stat.st_dev != top_stat.st_dev) {
            throw Error("cannot remove " + path + ": the tree changed while it was being removed");
        }
        if (::unlinkat(parent.get(), level.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
            throw system_error("cannot remove a directory in " + path);
        }
        levels.pop_back();
        current = std::move(parent);
    }
}

}  // namespace

void remove_tree(const std::string& path) {
    UniqueFd top(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!top && errno == EACCES && ::chmod(path.c_str(), 0700) == 0) {
        top.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!top) {
        if (errno == ENOENT) return;
        throw system_error("cannot open " + path);
    }
    remove_contents(std::move(top), path);
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) throw system_error("cannot remove " + path);
}

void remove_tree_at(int parent, const std::string& name, const std::string& what) {
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return;
        throw system_error("cannot stat " + what);
    }
    if (!S_ISDIR(st.st_mode)) {
        if (::unlinkat(parent, name.c_str(), 0) != 0 && errno != ENOENT) {
            throw system_error("cannot remove " + what);
        }
        return;
    }
    UniqueFd top = open_subdirectory(parent, name, what);
    if (!top) return;
    remove_contents(std::move(top), what);
    if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        throw system_error("cannot remove " + what);
    }
}

}  // namespace sqbox

#include "image/container_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "util/errors.h"
#include "util/file_tree.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr const char* kStoreLock = ".sqbox-store.lock";
constexpr const char* kReservedPrefix = ".sqbox-";
constexpr const char* kTrashPrefix = ".sqbox-trash-";
constexpr const char* kContainerPrefix = ".sqbox-container-";
constexpr const char* kMetadataFile = "container.json";

struct ImageIdentity {
    uint64_t device = 0;
    uint64_t inode = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;

    bool operator==(const ImageIdentity&) const = default;
};

ImageIdentity identify(const std::string& image) {
    struct stat st {};
    if (::stat(image.c_str(), &st) != 0) throw system_error("image " + image);
    return {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size),
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::string random_suffix() {
    std::random_device device;
    std::uniform_int_distribution<uint32_t> digits;
    char buffer[16];
    (void)std::snprintf(buffer, sizeof buffer, "%08x", digits(device));
    return buffer;
}

void make_directory(const std::string& path, mode_t mode) {
    if (::mkdir(path.c_str(), mode) != 0) throw system_error("cannot create " + path);
}

// A new container's directory until a name points at it: a create that fails before deletes it.
class UnnamedDirectory {
  public:
    explicit UnnamedDirectory(std::string path) : path_(std::move(path)) {}
    UnnamedDirectory(const UnnamedDirectory&) = delete;
    UnnamedDirectory& operator=(const UnnamedDirectory&) = delete;
    ~UnnamedDirectory() {
        if (path_.empty()) return;
        try {
            remove_tree(path_);
        } catch (const Error&) {  // nothing names it: the next sweep deletes what is left
        }
    }
    void named() { path_.clear(); }

  private:
    std::string path_;
};

}  // namespace

ContainerStore::ContainerStore(std::string data_path) : data_path_(std::move(data_path)) {
    // enroot creates its directories private to the user.
    make_directories(data_path_, 0700);
}

void ContainerStore::check_name(const std::string& name) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name.rfind(kReservedPrefix, 0) == 0) {
        throw Error("Invalid argument: " + name);
    }
}

UniqueFd ContainerStore::lock_store() const {
    return lock_file(data_path_ + "/" + kStoreLock);
}

namespace {

// A symlink's target when it is one of the store's container directories (a plain name under
// DATA), or nullopt (a symlink someone else made, or none at all).
std::optional<std::string> container_link_target(const std::string& link) {
    char buffer[64];
    const ssize_t length = ::readlink(link.c_str(), buffer, sizeof buffer);
    if (length < 0) {
        if (errno == ENOENT || errno == EINVAL) return std::nullopt;
        throw system_error("cannot read " + link);
    }
    const std::string target(buffer, static_cast<size_t>(length));
    if (static_cast<size_t>(length) == sizeof buffer || target.find('/') != std::string::npos ||
        target.rfind(kContainerPrefix, 0) != 0) {
        return std::nullopt;
    }
    return target;
}

enum class DeletionLock { kTaken, kGone, kHeld, kUnopenable };

// Takes `path`'s directory with an exclusive flock into `directory`, unless someone holds it: a
// start (shared) or another deleter (exclusive, for the whole deletion, so a remove and a
// concurrent sweep never tear down the same tree at once).
DeletionLock lock_for_deletion(const std::string& path, UniqueFd& directory) {
    directory.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!directory) return errno == ENOENT ? DeletionLock::kGone : DeletionLock::kUnopenable;
    if (::flock(directory.get(), LOCK_EX | LOCK_NB) == 0) return DeletionLock::kTaken;
    if (errno != EWOULDBLOCK) throw system_error("cannot lock " + path);
    directory.reset();
    return DeletionLock::kHeld;
}

// Deletes a directory unless someone holds it (see lock_for_deletion); false when held.
bool delete_unless_held(const std::string& path) {
    UniqueFd directory;
    switch (lock_for_deletion(path, directory)) {
        case DeletionLock::kGone:
            return true;
        case DeletionLock::kHeld:
            return false;
        case DeletionLock::kTaken:       // deleted holding the lock
        case DeletionLock::kUnopenable:  // mode 000: nobody can hold it; remove_tree fixes that
            break;
    }
    remove_tree(path);
    return true;
}

bool same_file(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// for_each_directory_entry, throwing Error "cannot list DIR" where it cannot list.
void for_each_entry(const std::string& directory,
                    const std::function<void(int dir_fd, const std::string& name)>& visit) {
    if (!for_each_directory_entry(directory, visit)) {
        throw system_error("cannot list " + directory);
    }
}

}  // namespace

std::string ContainerStore::move_to_trash(const std::string& path) const {
    // Never over another trash name: that one's container would be orphaned.
    for (;;) {
        std::string trash = data_path_ + "/" + kTrashPrefix + random_suffix();
        if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, trash.c_str(), RENAME_NOREPLACE) == 0) {
            return trash;
        }
        if (errno != EEXIST) throw system_error("cannot remove " + path);
    }
}

void ContainerStore::collect_trash(const std::string& trash) const {
    struct stat st {};
    if (::lstat(trash.c_str(), &st) != 0) {
        if (errno == ENOENT) return;  // collected by someone else
        throw system_error("cannot inspect " + trash);
    }
    if (S_ISDIR(st.st_mode)) {
        (void)delete_unless_held(trash);  // an older sqbox's container, or enroot's
        return;
    }
    if (S_ISLNK(st.st_mode)) {
        if (auto target = container_link_target(trash)) {
            if (!delete_unless_held(data_path_ + "/" + *target)) return;  // its last holder will
        }
    }
    if (::unlink(trash.c_str()) != 0 && errno != ENOENT) {
        throw system_error("cannot remove " + trash);
    }
}

void ContainerStore::delete_orphans() const {
    std::vector<std::pair<std::string, UniqueFd>> orphans;
    {
        // Under the store lock, names and trash do not change, and a create holds its directory
        // exclusively from the moment it exists until it is named.
        UniqueFd lock = lock_store();
        std::set<std::string> linked;
        std::vector<std::string> directories;
        for_each_entry(data_path_, [&](int dir_fd, const std::string& name) {
            struct stat st {};
            if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
            if (S_ISLNK(st.st_mode)) {
                if (auto target = container_link_target(data_path_ + "/" + name)) {
                    linked.insert(*target);
                }
            } else if (S_ISDIR(st.st_mode) && name.rfind(kContainerPrefix, 0) == 0) {
                directories.push_back(name);
            }
        });
        for (const auto& name : directories) {
            if (linked.count(name) != 0) continue;
            const std::string path = data_path_ + "/" + name;
            UniqueFd held;
            if (lock_for_deletion(path, held) == DeletionLock::kTaken) {
                orphans.emplace_back(path, std::move(held));
            }
        }
    }
    for (const auto& [path, held] : orphans) remove_tree(path);  // still holding each
}

void ContainerStore::sweep() const {
    // Leftovers of other commands: a failure here is not this command's.
    const auto warn = [](const Error& e) { print_error(std::string("warning: ") + e.what()); };
    std::vector<std::string> trash;
    try {
        for_each_entry(data_path_, [&](int, const std::string& name) {
            if (name.rfind(kTrashPrefix, 0) == 0) trash.push_back(name);
        });
    } catch (const Error& e) {
        warn(e);
    }
    for (const auto& name : trash) {
        try {
            collect_trash(data_path_ + "/" + name);
        } catch (const Error& e) {
            warn(e);
        }
    }
    try {
        delete_orphans();
    } catch (const Error& e) {
        warn(e);
    }
}

void ContainerStore::create(const std::string& name, const std::string& image, bool replace) {
    check_name(name);
    const ImageIdentity identity = identify(image);
    // The directory is complete before a name points at it, so nobody ever sees it half made;
    // it is held exclusively from its first instant (made under the store lock) until it is
    // named, so a sweep never takes it for a killed create's leftover.
    std::string directory_name;
    std::string directory;
    UniqueFd held;
    {
        UniqueFd lock = lock_store();
        for (;;) {
            directory_name = kContainerPrefix + random_suffix();
            directory = data_path_ + "/" + directory_name;
            if (::mkdir(directory.c_str(), 0700) == 0) break;
            if (errno != EEXIST) throw system_error("cannot create " + directory);
        }
        held.reset(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!held || ::flock(held.get(), LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            (void)::rmdir(directory.c_str());
            throw system_error("cannot create " + directory, err);
        }
    }
    UnnamedDirectory unnamed(directory);
    make_directory(directory + "/upper", 0755);
    make_directory(directory + "/work", 0700);
    nlohmann::json metadata = {{"image", image},
                               {"device", identity.device},
                               {"inode", identity.inode},
                               {"size", identity.size},
                               {"mtime_ns", identity.mtime_ns}};
    write_file_at(held.get(), kMetadataFile, metadata.dump(2) + "\n", O_EXCL | O_NOFOLLOW, 0600);
    write_file_at(held.get(), "lock", "", O_EXCL | O_NOFOLLOW, 0600);

    const std::string target = data_path_ + "/" + name;
    std::string trash;
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::lstat(target.c_str(), &st) == 0) {
            if (!replace) throw Error("File already exists: " + target);
            trash = move_to_trash(target);
        }
        if (::symlink(directory_name.c_str(), target.c_str()) != 0) {
            const int err = errno;
            if (!trash.empty()) (void)::rename(trash.c_str(), target.c_str());  // as it was
            throw system_error("cannot create " + target, err);
        }
        unnamed.named();
    }
    if (!trash.empty()) collect_trash(trash);
}

void ContainerStore::remove(const std::string& name) {
    check_name(name);
    const std::string target = data_path_ + "/" + name;
    std::string trash;
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::stat(target.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            throw Error("No such file or directory: " + target);
        }
        trash = move_to_trash(target);
    }
    // Outside the lock: deleting a large layer must not hold up other containers. Leftovers of
    // interrupted commands, and trash that a start held until now, go too.
    collect_trash(trash);
    sweep();
}

std::optional<std::string> ContainerStore::directory_of(const std::string& name) const {
    const std::string path = data_path_ + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return std::nullopt;
        throw system_error("cannot inspect " + path);
    }
    if (S_ISLNK(st.st_mode)) {
        if (auto target = container_link_target(path)) return data_path_ + "/" + *target;
        if (::stat(path.c_str(), &st) != 0) return std::nullopt;  // a dangling symlink of yours
    }
    return S_ISDIR(st.st_mode) ? std::optional(path) : std::nullopt;
}

std::optional<HeldContainer> ContainerStore::find(const std::string& name) const {
    check_name(name);
    // Each retry means the container was removed (or replaced) between two of these steps; a
    // name that never settles is as good as gone.
    for (int attempt = 0; attempt < 100; ++attempt) {
        std::optional<std::string> path = directory_of(name);
        if (!path) return std::nullopt;
        UniqueFd directory(::open(path->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!directory) {
            if (errno == ENOENT) continue;  // deleted since
            throw system_error("cannot open container " + name);
        }
        if (::flock(directory.get(), LOCK_SH | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) continue;  // being deleted
            throw system_error("cannot lock container " + name);
        }
        HeldContainer held(*this);
        held.info_.name = name;
        held.info_.directory = *path;
        held.directory_ = std::move(directory);
        // Held now, so no deletion starts from here on. One may have started and stopped half
        // way (killed) before; but deletion only ever follows a remove, so a container that its
        // name still means was never touched. (If it was removed, letting go of it here sweeps
        // what a deleter may have left because of this brief hold.)
        struct stat opened {};
        struct stat there {};
        if (::fstat(held.directory_.get(), &opened) != 0) {
            throw system_error("cannot inspect container " + name);
        }
        if (::stat(path->c_str(), &there) != 0 || !same_file(opened, there) ||
            directory_of(name) != path) {
            continue;
        }

        UniqueFd metadata_fd(
            ::openat(held.directory_.get(), kMetadataFile, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!metadata_fd) {
            if (errno == ENOENT) return held;  // a root filesystem unpacked by enroot itself
            throw system_error("cannot open the metadata of container " + name);
        }
        try {
            const nlohmann::json metadata =
                nlohmann::json::parse(read_all(metadata_fd.get(), "container " + name));
            held.info_.image = metadata.at("image").get<std::string>();
            const ImageIdentity recorded{
                metadata.at("device").get<uint64_t>(), metadata.at("inode").get<uint64_t>(),
                metadata.at("size").get<uint64_t>(), metadata.at("mtime_ns").get<int64_t>()};
            if (!(identify(held.info_.image) == recorded)) {
                throw Error("the image " + held.info_.image + " of container " + name +
                            " changed since the container was created; create it again");
            }
        } catch (const nlohmann::json::exception& e) {
            throw Error("container " + name + " has unreadable metadata: " + e.what());
        }
        held.info_.layer = held.info_.directory;
        return held;
    }
    return std::nullopt;
}

HeldContainer& HeldContainer::operator=(HeldContainer&& other) noexcept {
    if (this != &other) {
        let_go();
        store_ = std::move(other.store_);
        info_ = std::move(other.info_);
        directory_ = std::move(other.directory_);
    }
    return *this;
}

void HeldContainer::let_go() noexcept {
    if (!directory_) return;  // moved from
    directory_.reset();
    // Removed or replaced while it was held: its remover left it to its last holder. A failure
    // here is not the holder's: the next remove sweeps again.
    try {
        if (store_.directory_of(info_.name) != info_.directory) store_.sweep();
    } catch (const std::exception& e) {
        print_error(std::string("warning: ") + e.what());
    }
}

std::vector<std::string> ContainerStore::names() const {
    std::vector<std::string> names;
    for_each_entry(data_path_, [&](int dir_fd, const std::string& name) {
        if (name.front() == '.') return;
        struct stat st {};
        if (::fstatat(dir_fd, name.c_str(), &st, 0) == 0 && S_ISDIR(st.st_mode)) {
            names.push_back(name);
        }
    });
    std::sort(names.begin(), names.end());
    return names;
}

ContainerLock::ContainerLock(const HeldContainer& container, bool exclusive, int wait_seconds) {
    const std::string path = container.info().directory + "/lock";
    fd_.reset(::openat(container.directory_fd(), "lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) throw system_error("cannot open " + path);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_seconds);
    const int operation = (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
    while (::flock(fd_.get(), operation) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) throw system_error("cannot lock " + path);
        if (std::chrono::steady_clock::now() >= deadline) {
            throw Error("Could not acquire rootfs lock: container " + container.info().name +
                        " is in use");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace sqbox

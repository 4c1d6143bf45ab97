#include "image/container_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
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

// Deletes a directory unless someone holds it: a start (shared flock, see find) or another
// deleter (exclusive flock, held for the whole deletion, so a remove and a concurrent sweep of
// leftovers never tear down the same tree at once). False when it is held.
bool delete_unless_held(const std::string& path) {
    UniqueFd directory(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (directory && ::flock(directory.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return false;
        throw system_error("cannot lock " + path);
    }
    if (!directory && errno == ENOENT) return true;
    remove_tree(path);  // holding the lock; unopenable (mode 000), remove_tree fixes that
    return true;
}

bool same_file(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

void ContainerStore::collect_trash(const std::string& trash) const {
    struct stat st {};
    if (::lstat(trash.c_str(), &st) != 0) {
        if (errno == ENOENT) return;  // collected by someone else
        throw system_error("cannot inspect " + trash);
    }
    if (!S_ISLNK(st.st_mode)) {
        (void)delete_unless_held(trash);  // a directory: an older sqbox's container, or enroot's
        return;
    }
    if (auto target = container_link_target(trash)) {
        if (!delete_unless_held(data_path_ + "/" + *target)) return;  // its last start collects it
    }
    if (::unlink(trash.c_str()) != 0 && errno != ENOENT) {
        throw system_error("cannot remove " + trash);
    }
}

void ContainerStore::sweep_trash() const {
    for (const auto& name : [&] {
             std::vector<std::string> trash;
             std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(data_path_.c_str()), ::closedir);
             if (!dir) return trash;
             while (dirent* entry = ::readdir(dir.get())) {
                 if (std::string(entry->d_name).rfind(kTrashPrefix, 0) == 0) {
                     trash.emplace_back(entry->d_name);
                 }
             }
             return trash;
         }()) {
        // Leftovers of another remove: a failure here is not this command's.
        try {
            collect_trash(data_path_ + "/" + name);
        } catch (const Error& e) {
            print_error(std::string("warning: ") + e.what());
        }
    }
}

void ContainerStore::create(const std::string& name, const std::string& image, bool replace) {
    check_name(name);
    const ImageIdentity identity = identify(image);
    // The directory is complete before a name points at it, so nobody ever sees it half made.
    const std::string directory_name = kContainerPrefix + random_suffix();
    const std::string directory = data_path_ + "/" + directory_name;
    make_directory(directory, 0700);
    try {
        make_directory(directory + "/upper", 0755);
        make_directory(directory + "/work", 0700);
        nlohmann::json metadata = {{"image", image},
                                   {"device", identity.device},
                                   {"inode", identity.inode},
                                   {"size", identity.size},
                                   {"mtime_ns", identity.mtime_ns}};
        write_file_at(AT_FDCWD, directory + "/" + kMetadataFile, metadata.dump(2) + "\n",
                      O_EXCL | O_NOFOLLOW, 0600);
        write_file_at(AT_FDCWD, directory + "/lock", "", O_EXCL | O_NOFOLLOW, 0600);
    } catch (...) {
        remove_tree(directory);
        throw;
    }

    const std::string target = data_path_ + "/" + name;
    std::string trash;
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::lstat(target.c_str(), &st) == 0) {
            if (!replace) {
                remove_tree(directory);
                throw Error("File already exists: " + target);
            }
            trash = data_path_ + "/" + kTrashPrefix + random_suffix();
            if (::rename(target.c_str(), trash.c_str()) != 0) {
                remove_tree(directory);
                throw system_error("cannot replace " + target);
            }
        }
        if (::symlink(directory_name.c_str(), target.c_str()) != 0) {
            const int err = errno;
            remove_tree(directory);
            throw system_error("cannot create " + target, err);
        }
    }
    if (!trash.empty()) collect_trash(trash);
}

void ContainerStore::remove(const std::string& name) {
    check_name(name);
    const std::string target = data_path_ + "/" + name;
    const std::string trash = data_path_ + "/" + kTrashPrefix + random_suffix();
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::stat(target.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            throw Error("No such file or directory: " + target);
        }
        if (::rename(target.c_str(), trash.c_str()) != 0) {
            throw system_error("cannot remove " + target);
        }
    }
    // Outside the lock: deleting a large layer must not hold up other containers. Trash that an
    // interrupted remove left behind, or that a start still held, goes too.
    collect_trash(trash);
    sweep_trash();
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
        HeldContainer held;
        held.directory.reset(::open(path->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!held.directory) {
            if (errno == ENOENT) continue;  // deleted since
            throw system_error("cannot open container " + name);
        }
        if (::flock(held.directory.get(), LOCK_SH | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) continue;  // being deleted
            throw system_error("cannot lock container " + name);
        }
        // Held now, so it cannot be deleted from here on; it must not have been deleted before.
        struct stat opened {};
        struct stat there {};
        if (::fstat(held.directory.get(), &opened) != 0) {
            throw system_error("cannot inspect container " + name);
        }
        if (::stat(path->c_str(), &there) != 0 || !same_file(opened, there)) continue;

        held.info.name = name;
        held.info.directory = *path;
        UniqueFd metadata_fd(
            ::openat(held.directory.get(), kMetadataFile, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!metadata_fd) {
            if (errno == ENOENT) return held;  // a root filesystem unpacked by enroot itself
            throw system_error("cannot open the metadata of container " + name);
        }
        try {
            const nlohmann::json metadata =
                nlohmann::json::parse(read_all(metadata_fd.get(), "container " + name));
            held.info.image = metadata.at("image").get<std::string>();
            const ImageIdentity recorded{
                metadata.at("device").get<uint64_t>(), metadata.at("inode").get<uint64_t>(),
                metadata.at("size").get<uint64_t>(), metadata.at("mtime_ns").get<int64_t>()};
            if (!(identify(held.info.image) == recorded)) {
                throw Error("the image " + held.info.image + " of container " + name +
                            " changed since the container was created; create it again");
            }
        } catch (const nlohmann::json::exception& e) {
            throw Error("container " + name + " has unreadable metadata: " + e.what());
        }
        held.info.layer = held.info.directory;
        return held;
    }
    return std::nullopt;
}

void ContainerStore::release(HeldContainer container) const {
    container.directory.reset();
    // Removed or replaced while it was held: its remover left it to its last holder. A failure
    // here is not the start's: the next remove sweeps again.
    try {
        if (directory_of(container.info.name) != container.info.directory) sweep_trash();
    } catch (const Error& e) {
        print_error(std::string("warning: ") + e.what());
    }
}

std::vector<std::string> ContainerStore::names() const {
    std::vector<std::string> names;
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(data_path_.c_str()), ::closedir);
    if (!dir) throw system_error("cannot list " + data_path_);
    while (dirent* entry = ::readdir(dir.get())) {
        std::string name = entry->d_name;
        if (name.empty() || name.front() == '.') continue;
        struct stat st {};
        if (::fstatat(::dirfd(dir.get()), name.c_str(), &st, 0) == 0 && S_ISDIR(st.st_mode)) {
            names.push_back(std::move(name));
        }
    }
    std::sort(names.begin(), names.end());
    return names;
}

ContainerLock::ContainerLock(const HeldContainer& container, bool exclusive, int wait_seconds) {
    const std::string path = container.info.directory + "/lock";
    fd_.reset(::openat(container.directory.get(), "lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) throw system_error("cannot open " + path);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_seconds);
    const int operation = (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
    while (::flock(fd_.get(), operation) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) throw system_error("cannot lock " + path);
        if (std::chrono::steady_clock::now() >= deadline) {
            throw Error("Could not acquire rootfs lock: container " + container.info.name +
                        " is in use");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace sqbox

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

// Deletes a trash directory unless another process is already deleting it: each deleter holds an
// exclusive flock on the directory, so a remove and a concurrent sweep of leftovers never tear
// down the same tree at once (and fail on each other's half-deleted entries).
void delete_trash(const std::string& path) {
    UniqueFd directory(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (directory && ::flock(directory.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return;  // being deleted by its owner, or by another sweep
        throw system_error("cannot lock " + path);
    }
    if (!directory && errno == ENOENT) return;
    remove_tree(path);  // holding the lock; unopenable (mode 000), remove_tree fixes that
}

}  // namespace

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
            delete_trash(data_path_ + "/" + name);
        } catch (const Error& e) {
            print_error(std::string("warning: ") + e.what());
        }
    }
}

void ContainerStore::create(const std::string& name, const std::string& image, bool replace) {
    check_name(name);
    const ImageIdentity identity = identify(image);
    // The new container is made under a private name and renamed into place, so nobody ever sees
    // it half made.
    const std::string staging = data_path_ + "/" + kReservedPrefix + "new-" + random_suffix();
    make_directory(staging, 0700);
    try {
        make_directory(staging + "/upper", 0755);
        make_directory(staging + "/work", 0700);
        nlohmann::json metadata = {{"image", image},
                                   {"device", identity.device},
                                   {"inode", identity.inode},
                                   {"size", identity.size},
                                   {"mtime_ns", identity.mtime_ns}};
        write_file_at(AT_FDCWD, staging + "/" + kMetadataFile, metadata.dump(2) + "\n",
                      O_EXCL | O_NOFOLLOW, 0600);
        write_file_at(AT_FDCWD, staging + "/lock", "", O_EXCL | O_NOFOLLOW, 0600);
    } catch (...) {
        remove_tree(staging);
        throw;
    }

    const std::string target = data_path_ + "/" + name;
    std::string trash;
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::lstat(target.c_str(), &st) == 0) {
            if (!replace) {
                remove_tree(staging);
                throw Error("File already exists: " + target);
            }
            trash = data_path_ + "/" + kTrashPrefix + random_suffix();
            if (::rename(target.c_str(), trash.c_str()) != 0) {
                remove_tree(staging);
                throw system_error("cannot replace " + target);
            }
        }
        if (::rename(staging.c_str(), target.c_str()) != 0) {
            const int err = errno;
            remove_tree(staging);
            throw system_error("cannot create " + target, err);
        }
    }
    if (!trash.empty()) delete_trash(trash);
}

void ContainerStore::remove(const std::string& name) {
    check_name(name);
    const std::string target = data_path_ + "/" + name;
    const std::string trash = data_path_ + "/" + kTrashPrefix + random_suffix();
    {
        UniqueFd lock = lock_store();
        struct stat st {};
        if (::lstat(target.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            throw Error("No such file or directory: " + target);
        }
        if (::rename(target.c_str(), trash.c_str()) != 0) {
            throw system_error("cannot remove " + target);
        }
    }
    // Outside the lock: deleting a large layer must not hold up other containers. Trash that an
    // interrupted remove left behind goes too.
    delete_trash(trash);
    sweep_trash();
}

std::optional<ContainerInfo> ContainerStore::find(const std::string& name) const {
    check_name(name);
    ContainerInfo info;
    info.name = name;
    info.directory = data_path_ + "/" + name;
    struct stat st {};
    if (::stat(info.directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;

    UniqueFd metadata_fd(
        ::open((info.directory + "/" + kMetadataFile).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!metadata_fd) {
        if (errno == ENOENT) return info;  // a root filesystem unpacked by enroot itself
        throw system_error("cannot open the metadata of container " + name);
    }
    nlohmann::json metadata;
    try {
        metadata = nlohmann::json::parse(read_all(metadata_fd.get(), "container " + name));
        info.image = metadata.at("image").get<std::string>();
        const ImageIdentity recorded{
            metadata.at("device").get<uint64_t>(), metadata.at("inode").get<uint64_t>(),
            metadata.at("size").get<uint64_t>(), metadata.at("mtime_ns").get<int64_t>()};
        if (!(identify(info.image) == recorded)) {
            throw Error("the image " + info.image + " of container " + name +
                        " changed since the container was created; create it again");
        }
    } catch (const nlohmann::json::exception& e) {
        throw Error("container " + name + " has unreadable metadata: " + e.what());
    }
    info.layer = info.directory;
    return info;
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

ContainerLock::ContainerLock(const ContainerInfo& container, bool exclusive, int wait_seconds) {
    const std::string path = container.directory + "/lock";
    fd_.reset(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) throw system_error("cannot open " + path);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_seconds);
    const int operation = (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
    while (::flock(fd_.get(), operation) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) throw system_error("cannot lock " + path);
        if (std::chrono::steady_clock::now() >= deadline) {
            throw Error("Could not acquire rootfs lock: container " + container.name +
                        " is in use");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace sqbox

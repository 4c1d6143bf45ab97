#include "util/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "util/errors.h"

namespace sqbox {

bool write_all(int fd, const void* data, size_t size) {
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
        ssize_t n = ::write(fd, bytes, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        bytes += n;
        size -= static_cast<size_t>(n);
    }
    return true;
}

ssize_t read_full(int fd, void* data, size_t size) {
    auto* bytes = static_cast<char*>(data);
    size_t total = 0;
    while (total < size) {
        ssize_t n = ::read(fd, bytes + total, size - total);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) break;
        total += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(total);
}

void write_file_at(int dir_fd, const std::string& path, std::string_view content, int flags,
                   mode_t mode) {
    UniqueFd fd(
        ::openat(dir_fd, path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | flags, mode));
    if (!fd) throw system_error("cannot open " + path + " for writing");
    if (!write_all(fd.get(), content.data(), content.size())) {
        throw system_error("cannot write " + path);
    }
}

std::string read_bounded_regular_file(int fd, size_t max_bytes, const std::string& what) {
    struct stat info {};
    if (::fstat(fd, &info) != 0) throw system_error("stat of " + what);
    if (!S_ISREG(info.st_mode)) throw Error(what + " is not a regular file");
    // Room for the size the file says it has (a page at least: /proc says 0) and one byte more,
    // which EOF leaves unread; not the whole bound, whose zeroing and page faults cost more than
    // the read (several of these are read at every sandbox's start). Grown, up to one byte over
    // the bound, while the file gives more than it said: reading that byte means it is too large.
    const auto said = static_cast<size_t>(std::max<off_t>(info.st_size, 0));
    size_t room = std::min(std::max<size_t>(said, 4095), max_bytes) + 1;
    std::string content;
    for (;;) {
        const size_t filled = content.size();
        content.resize(room);
        const ssize_t n = read_full(fd, content.data() + filled, room - filled);
        if (n < 0) throw system_error("cannot read " + what);
        content.resize(filled + static_cast<size_t>(n));
        if (content.size() > max_bytes) {
            throw Error(what + " is larger than " + std::to_string(max_bytes / 1024) + " KiB");
        }
        if (content.size() < room) return content;
        room = std::min(room * 2, max_bytes + 1);
    }
}

std::string read_all(int fd, const std::string& what) {
    std::string content;
    char buffer[4096];
    for (;;) {
        ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw system_error("cannot read " + what);
        }
        if (n == 0) break;
        content.append(buffer, static_cast<size_t>(n));
    }
    return content;
}

Pipe make_pipe(const std::string& purpose) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw system_error("cannot create " + purpose + " pipe");
    return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void set_nonblocking(int fd, const std::string& what) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        throw system_error("cannot make " + what + " non-blocking");
    }
}

void make_directories(const std::string& path, mode_t mode) {
    for (size_t start = 1; start <= path.size();) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        const std::string partial = path.substr(0, slash);
        if (::mkdir(partial.c_str(), mode) != 0 && errno != EEXIST) {
            throw system_error("cannot create " + partial);
        }
        start = slash + 1;
    }
}

namespace {

UniqueFd open_lock_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) throw system_error("cannot open " + path);
    return fd;
}

}  // namespace

UniqueFd lock_file(const std::string& path) {
    UniqueFd fd = open_lock_file(path);
    while (::flock(fd.get(), LOCK_EX) != 0) {
        if (errno != EINTR) throw system_error("cannot lock " + path);
    }
    return fd;
}

UniqueFd lock_file_within(const std::string& path, int wait_ms) {
    UniqueFd fd = open_lock_file(path);
    constexpr int kPollMs = 2;
    for (int waited = 0;; waited += kPollMs) {
        if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) throw system_error("cannot lock " + path);
        if (waited >= wait_ms) return UniqueFd();
        ::usleep(kPollMs * 1000);
    }
}

void make_private_directory(const std::string& path) {
    make_directories(path, 0700);
    require_private_directory(path);
}

void require_private_directory(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) throw system_error("cannot use " + path);
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
        throw Error(path + " must be a directory of yours that no one else can write");
    }
}

bool for_each_directory_entry(
    const std::string& directory,
    const std::function<void(int dir_fd, const std::string& name)>& visit) {
    std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(directory.c_str()), ::closedir);
    if (!listing) return false;
    while (const dirent* entry = ::readdir(listing.get())) {
        const std::string name = entry->d_name;
        if (name == "." || name == "..") continue;
        visit(::dirfd(listing.get()), name);
    }
    return true;
}

}  // namespace sqbox

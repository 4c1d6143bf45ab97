// Small, checked file helpers used by the launch pipeline.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "util/unique_fd.h"

namespace sqbox {

// Writes all of `data` to `fd`, retrying on EINTR and short writes. Returns false on error.
bool write_all(int fd, const void* data, size_t size);

// Reads up to `size` bytes, retrying on EINTR until EOF or the buffer is full. Returns the count,
// or -1 on error.
ssize_t read_full(int fd, void* data, size_t size);

// Opens `path` (relative to `dir_fd`) for writing, truncating, and writes `content` to it.
void write_file_at(int dir_fd, const std::string& path, std::string_view content, int flags = 0,
                   mode_t mode = 0644);

// Reads `fd`, which must be a regular file of at most `max_bytes` (an image's small config
// files: a FIFO would block, a device or a huge file would cost without bound). Throws Error
// naming `what` otherwise.
std::string read_bounded_regular_file(int fd, size_t max_bytes, const std::string& what);

// Reads everything from `fd` to EOF; throws Error naming `what` on failure.
std::string read_all(int fd, const std::string& what);

// pipe2(O_CLOEXEC), checked.
Pipe make_pipe(const std::string& purpose);

// Sets O_NONBLOCK on `fd`; throws Error "cannot make WHAT non-blocking" on failure.
void set_nonblocking(int fd, const std::string& what);

// Creates the absolute directory `path` and any missing parent with `mode` (existing ones are
// left as they are). Throws Error "cannot create DIR" naming the one that failed.
void make_directories(const std::string& path, mode_t mode);

// make_directories(path, 0700), then requires `path` to be a directory of the caller's that no
// one else can write (what it holds is trusted: run as a root filesystem, or a secret). Throws
// Error saying why not.
void make_private_directory(const std::string& path);

// The check of make_private_directory alone, for a directory that exists.
void require_private_directory(const std::string& path);

// Calls `visit` with each entry's name in `directory` but "." and "..", and the listing's
// descriptor (for *at calls on the entry). Returns false, with errno set and nothing visited, when
// the directory cannot be opened for listing.
[[nodiscard]] bool for_each_directory_entry(
    const std::string& directory,
    const std::function<void(int dir_fd, const std::string& name)>& visit);

// Opens (creating, 0600) the lock file `path` and takes an exclusive flock on it, waiting for it;
// the lock goes with the descriptor. Throws Error naming the file.
UniqueFd lock_file(const std::string& path);

// lock_file, waiting at most `wait_ms` for the lock: an invalid descriptor if it is still held
// by then. Throws Error naming the file if it cannot be opened.
UniqueFd lock_file_within(const std::string& path, int wait_ms);

}  // namespace sqbox

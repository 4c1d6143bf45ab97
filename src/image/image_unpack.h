// A .sqsh image unpacked whole into the caller's cache, for hosts where it cannot be mounted
// over FUSE (no usable /dev/fuse: a pod without a device plugin). The sandbox then runs from the
// unpacked directory exactly as from a directory image: read-only, nosuid, nodev, the lower layer
// of its overlay. No isolation is lost: the image server is not needed at all.
//
// The image is untrusted input, so it is read (libsquashfuse, through the checks of
// image/squashfs_guards.h) in a confined child (security/confined_work.h) whose only writable
// place is a fresh temporary directory: no capability, seccomp, Landlock, no view of other
// files. It creates directories, regular files and symlinks only, each relative to the directory
// above it (mkdirat, openat with O_NOFOLLOW | O_EXCL, symlinkat), never resolving a path it
// made, so symlinks aimed out of the tree are stored, not followed; names that are not plain
// names ("", ".", "..", a '/' or a NUL in them) make the image refused. Devices, FIFOs and
// sockets are left out (the sandbox has its own /dev), setuid and setgid bits are dropped, hard
// links become separate files. The launcher then walks what the child made without believing it
// (only those kinds, no setuid file, no extended attribute, within the budgets) before the
// directory is renamed into place: complete or not there at all.
//
// Budgets: kDefaultUnpackBytes of file contents (sizes as the image states them: a sparse file
// counts whole, it is written whole) and kDefaultUnpackEntries names, counted before anything is
// written; an image past either is refused with one line. At most kMaxUnpackedImages images are
// kept; making another removes the least recently made that no run is using.
//
// Layout: CACHE/images/ENTRY/{stamp,root/}, ENTRY named by the image file's identity (device,
// inode, size, modification and status change times): an image rewritten in place or replaced
// gets another entry and is never served stale. A run holds a shared lock on its entry while it
// lives, so that no other run removes it meanwhile.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "image/squashfuse_api.h"
#include "util/unique_fd.h"

namespace sqbox {

inline constexpr uint64_t kDefaultUnpackBytes = uint64_t{4} << 30;
inline constexpr size_t kDefaultUnpackEntries = 500000;
inline constexpr size_t kMaxUnpackedImages = 4;

struct ImageUnpackLimits {
    uint64_t total_bytes = kDefaultUnpackBytes;
    size_t entries = kDefaultUnpackEntries;
    size_t depth = 256;  // directories within directories
    std::chrono::milliseconds time_limit{std::chrono::minutes(10)};
    std::optional<sigset_t> stop_signals;  // as ConfinedLimits::stop_signals
};

struct UnpackedImage {
    std::string root;   // the directory to run from
    bool made = false;  // by this call
    uint64_t bytes = 0;
    size_t entries = 0;
    UniqueFd lock;  // the shared lock on the entry, held as long as the sandbox runs
};

// The image open at `image_fd` (`fs`, its file `image_path`, for messages) unpacked in
// `cache_directory` (sqbox_cache_directory()), made first if missing. Throws Error with a one-line
// reason (the image holds too much, is corrupt, the cache cannot be written, Landlock is missing),
// leaving nothing behind.
UnpackedImage unpack_image(sqfs* fs, int image_fd, const std::string& image_path,
                           const std::string& cache_directory,
                           const ImageUnpackLimits& limits = {});

// Gives a file or directory unpacked from an image (open at `fd`) the image's permission bits
// within `mode_mask`, its modification time, and the caller's group explicitly, whatever the cache
// directory would hand down (a setgid directory, a grpid mount). Throws Error naming `what`.
void set_unpacked_attributes(int fd, const struct stat& image, mode_t mode_mask,
                             const std::string& what);

// The confined child's work, exposed for the unit tests and fuzz targets: the whole image into
// the empty directory `root_fd`. Returns "BYTES ENTRIES". Throws Error on a budget, a bad name or
// an unreadable image.
std::string unpack_image_tree(sqfs* fs, int root_fd, const ImageUnpackLimits& limits);

// What the launcher checks of a tree the child made (see the header comment); returns
// {bytes, entries}. Throws Error saying what is wrong.
std::pair<uint64_t, size_t> check_unpacked_tree(const std::string& root,
                                                const ImageUnpackLimits& limits);

}  // namespace sqbox

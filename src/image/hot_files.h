// The files an image's warm-up list reads, unpacked once into the caller's cache and laid as a
// read-only layer between the sandbox's writable layer and the image.
//
// Every fresh sandbox starts with an empty page cache on its FUSE mount, so each file its
// payload reads comes through the image server again, 128 KiB per round trip: for Python's
// start-up, its 6.6 MB binary and the C library, some 10 MB, and the largest part of a cold
// start. Unpacked, those files are read from the host's page cache like any file of the host,
// and stay there between sandboxes.
//
// Only the files a warm-up list reads ('R') are unpacked, and lists come only from runs the
// caller made on purpose (--learn-warm-up) or from the image itself: what a payload reads in a
// plain run never decides what later sandboxes find unpacked (image/warm_up_list.h says why).
// Paths are resolved in the image (image/image_paths.h), never on the host, and the tree is made
// of directories and regular files only, each created relative to its parent without following
// anything.
//
// What a sandbox sees does not change: the unpacked tree holds each file at its own path (every
// symlink on the way followed in the image), with the image's content, size, permission bits and
// modification time, and each directory on the way with the image's permission bits and
// modification time. Files that are hard links, setuid or setgid are left in the image, where
// their link count and mode bits stay as they are. The owner is the caller, whom the image server
// also shows as every file's owner. What differs: inode numbers and the device, and a status
// change time of when the tree was made.
//
// The tree lives next to the list (DIRECTORY/KEY.files) and records the image file it was made
// from (device, inode, size, modification and status change times) and the list it unpacks: a
// rewritten image or a new list gets a new tree, made under the list directory's lock in
// KEY.files.tmp and swapped in by renames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "image/squashfuse_api.h"
#include "image/warm_up_list.h"

namespace sqbox {

struct HotFilesLimits {
    uint64_t total_bytes = uint64_t{256} << 20;  // what one image's tree may hold
    uint64_t file_bytes = uint64_t{64} << 20;    // larger files stay in the image
};

struct HotFiles {
    std::string tree;  // the directory to lay above the image
    size_t files = 0;  // unpacked in it
    uint64_t bytes = 0;
    bool made = false;  // by this call (it was missing or out of date)
};

// The unpacked tree for the files `names` reads, in the private list directory `directory`,
// for the image open at `image_fd` (`fs`) whose list is named `key`: the existing tree if it was
// made from this image file and these names, otherwise a new one. nullopt if none of the files
// can be unpacked (missing, not a regular file, too large, a hard link, setuid or setgid).
// Throws Error, naming the path, if the directory cannot be used or the tree cannot be made; it
// leaves no partial tree behind.
std::optional<HotFiles> prepare_hot_files(sqfs* fs, int image_fd, const std::string& directory,
                                          const std::string& key,
                                          const std::vector<WarmUpName>& names,
                                          const HotFilesLimits& limits = {});

}  // namespace sqbox

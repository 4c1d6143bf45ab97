// What sqbox keeps for one image file next to its warm-up list: the files the list reads,
// unpacked once and laid as a read-only layer between the sandbox's writable layer and the image,
// and, while the caller has learned no list, a copy of the list the image carries.
//
// Every fresh sandbox starts with an empty page cache on its FUSE mount, so each file its
// payload reads comes through the image server again, 128 KiB per round trip: for Python's
// start-up, its 6.6 MB binary and the C library, some 10 MB, and the largest part of a cold
// start. Unpacked, those files are read from the host's page cache like any file of the host,
// and stay there between sandboxes.
//
// Only the files a warm-up list reads ('R') are unpacked, and lists come only from runs the
// caller made on purpose (--learn-warm-up) or from the image itself: what a payload reads in a
// plain run never decides what later sandboxes find unpacked (warm_up/warm_up_list.h says why).
//
// The image is untrusted input, so everything read from it here (its own list, its directories
// and symlinks, the files) is read in a confined child process (security/confined_work.h) that
// can write only below the new entry. Paths are resolved in the image (image/image_paths.h),
// never on the host, within budgets of lookups and entries, and the tree is made of directories
// and regular files only, each created relative to its parent without following anything.
//
// What a sandbox sees does not change: the unpacked tree holds each file at its own path (every
// symlink on the way followed in the image), with the image's content, size, permission bits and
// modification time, and each directory on the way with the image's permission bits and
// modification time. Files that are hard links, setuid or setgid are left in the image. Owner and
// group are the caller's, whom the image server also shows as every file's. What differs: inode
// numbers and the device, a status change time of when the tree was made, and the link count and
// size of a directory that now merges the tree with the image (overlayfs reports 1 and its own).
//
// The entry (DIRECTORY/KEY.files: `stamp`, `tree/`, and `image-list` when the image's list is
// used) records the image file it was made from (device, inode, size, modification and status
// change times) and which list it unpacks: a rewritten image or a new list gets a new entry,
// made in KEY.files.tmp under KEY.files.lock and swapped in by renames. One that could not be
// made is recorded as failed, so that runs do not try again until the image or the list changes.
// At most kMaxEntries entries are kept; making one more removes the oldest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "image/squashfuse_api.h"
#include "util/unique_fd.h"
#include "warm_up/warm_up_list.h"

namespace sqbox {

struct UnpackedFilesLimits {
    uint64_t total_bytes = uint64_t{256} << 20;  // what one image's tree may hold
    uint64_t file_bytes = uint64_t{64} << 20;    // larger files stay in the image
    size_t entries = 16384;                      // directories and files created
    size_t lookups = 200000;                     // directory lookups, symlinks followed included
};

// Entries (images) whose files are kept in one list directory.
inline constexpr size_t kMaxEntries = 8;

struct UnpackedFiles {
    std::vector<WarmUpName> image_names;  // the image's own list, when no learned one was given
    std::string tree;                     // the unpacked tree; empty if there is none
    UniqueFd tree_fd;                     // O_PATH of `tree`, checked against its stamp
    size_t files = 0;
    uint64_t bytes = 0;
    bool made = false;    // by this call (it was missing or out of date)
    std::string failure;  // why the entry could not be made ("" if it could)
};

struct UnpackedFilesCounts {
    size_t files = 0;
    uint64_t bytes = 0;
};

// The confined child's work (prepare_unpacked_files runs it confined; the fuzz targets run it
// directly): with `learned` empty, the image's own list into `image-list` (in the directory
// `entry_fd`); the files of the list into `tree`. Throws Error if the entry cannot be written.
// What it made is counted by the launcher, which believes nothing the child says
// (check_made_entry).
void unpack_image_files(sqfs* fs, int entry_fd, const std::vector<WarmUpName>& learned,
                        const UnpackedFilesLimits& limits);

// What prepare_unpacked_files does with the entry directory the confined child made, before it
// stamps it: an image that took the child over could have made anything its Landlock rules
// allow, so nothing it reports is believed. Only `tree` (and, with `image_list`, `image-list`
// of a list's size at most) may be there; in the tree only directories and regular files of link
// count 1, neither setuid nor setgid, without extended attributes (overlayfs would act on
// user.overlay.* ones), within `limits`. Returns what the tree holds; throws Error saying what is
// wrong. Directories the image closes are opened for the walk and closed again.
UnpackedFilesCounts check_made_entry(const std::string& entry, bool image_list,
                                     const UnpackedFilesLimits& limits);

// The entry for the image open at `image_fd` (`fs`), whose list is named `key`, in the private
// list directory `directory`: the files of `learned` unpacked or, with `learned` empty, those of
// the image's own list, together with that list. Made first if missing or out of date. Throws
// Error, naming the path, if the directory cannot be used; a failure to read the image or to
// unpack is recorded in the entry and returned in `failure`, and leaves no partial tree.
UnpackedFiles prepare_unpacked_files(sqfs* fs, int image_fd, const std::string& directory,
                                     const std::string& key, const std::vector<WarmUpName>& learned,
                                     const UnpackedFilesLimits& limits = {});

}  // namespace sqbox

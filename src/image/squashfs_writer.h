// Packing a directory tree into a new squashfs image with libsquashfs, no external programs.
#pragma once

#include <string>
#include <vector>

namespace sqbox {

struct SquashfsWriteOptions {
    // Every file owned by uid/gid 0 in the image (as `mksquashfs -all-root`).
    bool all_root = true;
    // Names of entries directly under the top directory that are left out (e.g. ".lock").
    std::vector<std::string> exclude_top_level;
    // When set (a directory fd): the tree the packed one was made from, e.g. a container's image
    // under its writable layer. A regular file then keeps its setuid and setgid bits only where
    // this tree has a regular file at the same path (reached without symlinks) with those bits
    // and the same bytes; elsewhere the bits are dropped, so that what was added or changed on
    // top of the reference cannot become setuid or setgid (root, with all_root) in the image.
    int setid_reference_fd = -1;
};

struct SquashfsWriteSummary {
    // The paths (relative to the top) whose setuid/setgid bits were dropped, in the order packed.
    std::vector<std::string> setid_dropped;
};

// Writes the tree below `directory_fd` (an fd of a directory, O_PATH or O_RDONLY) to a new squashfs
// image at `output_path`, which must not exist yet (fails with an Error if it does). Regular files
// (data blocks and fragments; all-zero blocks are stored sparse), directories, symlinks, char/block
// devices, FIFOs and sockets are stored with their mode bits and mtimes; hard links are stored as
// copies (their data blocks are deduplicated). Gzip compression, 128 KiB blocks, an NFS export
// table, padded to 4 KiB like mksquashfs. The image's own time is the top directory's mtime, so one
// tree always gives the same bytes. If `output_path` lies inside the tree it is left out of it.
// On any failure the partial output file is removed and an Error naming the offending path is
// thrown. Never follows symlinks while walking: every lookup is an *at call relative to an open
// directory with O_NOFOLLOW; mount points are crossed like ordinary directories.
SquashfsWriteSummary write_squashfs_image(int directory_fd, const std::string& output_path,
                                          const SquashfsWriteOptions& options);

}  // namespace sqbox

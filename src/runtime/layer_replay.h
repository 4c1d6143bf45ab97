// Saving a container's --rw start: what the sandbox wrote (an overlay upper layer in its bounded
// tmpfs) is replayed, as ordinary file operations, onto a merged view of the container (an
// overlay whose upper layer is the container's own, on disk). overlayfs then records deletions
// and replaced directories in the container's layer in its own format.
#pragma once

#include <cstdint>

namespace sqbox {

struct ReplaySummary {
    uint64_t entries = 0;        // files, directories, links and deletions applied
    uint64_t data_bytes = 0;     // file data written (holes are not written)
    uint64_t setid_dropped = 0;  // regular files whose setuid/setgid bits were not kept
    uint64_t skipped = 0;        // sockets (nothing to keep) and devices (none can be made)
};

// Applies the overlay upper layer open at `upper_fd` (whiteouts: 0:0 character devices; replaced
// directories: the user.overlay.opaque xattr) to the merged tree open at `merged_fd`. Never follows
// a symbolic link of either tree; regular files keep their data (sparse where the source is), mode
// (without setuid/setgid) and times; hard links stay hard links; extended attributes are not kept.
// The file data written is bounded by what the tmpfs holding `upper_fd` holds. Throws Error with
// the path that failed.
ReplaySummary replay_upper_layer(int upper_fd, int merged_fd);

}  // namespace sqbox

// Where a regular file's bytes sit, verbatim, inside the image file.
//
// Images made the way enroot makes them by default (mksquashfs -noD) store file data blocks
// uncompressed. A read of such blocks needs no decoding: the FUSE server can hand the kernel the
// image's own page-cache pages (splice) instead of copying the bytes through its memory twice.
#pragma once

#include <cstdint>
#include <vector>

#include "image/squashfuse_api.h"

namespace sqbox {

struct ImageExtent {
    uint64_t image_offset;
    uint64_t length;
};

// Fills `extents` with the image byte ranges holding bytes [offset, offset + length) of regular
// file `inode`, adjacent blocks merged, and returns true, if every one of those bytes lies in a
// stored (uncompressed) data block inside the image's used size. Returns false (and the caller
// reads through libsquashfuse) for compressed blocks, holes, the tail in a fragment, or a block
// list that points outside the image. `length` must not reach past the end of the file.
bool find_stored_extents(sqfs* fs, sqfs_inode* inode, uint64_t offset, uint64_t length,
                         std::vector<ImageExtent>& extents);

// A libfuse buffer vector naming `extents` of the image open on `image_fd`, for fuse_reply_data
// (which splices it when the kernel allows, else reads it). It lives in `storage`, reused from
// call to call.
fuse_bufvec* image_extents_bufvec(int image_fd, const std::vector<ImageExtent>& extents,
                                  std::vector<char>& storage);

}  // namespace sqbox

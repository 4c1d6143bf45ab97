#include "image/squashfs_extents.h"

#include <algorithm>

#include "image/squashfs_guards.h"

namespace sqbox {

bool find_stored_extents(sqfs* fs, sqfs_inode* inode, uint64_t offset, uint64_t length,
                         std::vector<ImageExtent>& extents) {
    extents.clear();
    if (!S_ISREG(inode->base.mode) || length == 0) return false;
    const uint64_t end = offset + length;
    if (end < offset || end > inode->xtra.reg.file_size) return false;
    const uint64_t block_size = fs->sb.block_size;
    const uint64_t image_end = fs->sb.bytes_used;

    // The block list, fast-forwarded to the block holding `offset`; once it runs out, the rest
    // of the file is a fragment tail.
    sqfs_blocklist blocks;
    if (checked_blocklist(fs, inode, &blocks, offset) != SQFS_OK) {
        return false;
    }
    uint64_t position = offset;
    while (position < end) {
        if (blocks.remain == 0) return false;  // fragment tail
        if (sqfs_blocklist_next(&blocks) != SQFS_OK) return false;
        const uint64_t block_start = blocks.pos;
        if (block_start + block_size <= position) continue;  // before the range
        if (block_start > position) return false;  // a short block left a gap: not ours to judge
        bool compressed = true;
        uint32_t stored_size = 0;
        sqfs_data_header(blocks.header, &compressed, &stored_size);
        if (compressed || stored_size == 0 || stored_size > block_size) {
            return false;  // needs decoding, a hole, or not a block
        }
        // A stored block holds its bytes as they are: a full block, or the file's last one.
        const uint64_t block_end = block_start + stored_size;
        if (block_end <= position || blocks.block + stored_size > image_end ||
            blocks.block + stored_size < blocks.block) {
            return false;  // a block list that does not describe the file: let the reader fail
        }
        const uint64_t take = std::min(end, block_end) - position;
        const uint64_t image_offset = blocks.block + (position - block_start);
        if (!extents.empty() &&
            extents.back().image_offset + extents.back().length == image_offset) {
            extents.back().length += take;
        } else {
            extents.push_back({image_offset, take});
        }
        position += take;
    }
    return true;
}

fuse_bufvec* image_extents_bufvec(int image_fd, const std::vector<ImageExtent>& extents,
                                  std::vector<char>& storage) {
    // fuse_bufvec ends in a one-element array; the other elements follow it in the same block.
    storage.assign(sizeof(fuse_bufvec) + extents.size() * sizeof(fuse_buf), 0);
    auto* vector = reinterpret_cast<fuse_bufvec*>(storage.data());
    vector->count = extents.size();
    for (size_t i = 0; i < extents.size(); ++i) {
        fuse_buf& piece = vector->buf[i];
        piece.size = extents[i].length;
        piece.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
        piece.fd = image_fd;
        piece.pos = static_cast<off_t>(extents[i].image_offset);
    }
    return vector;
}

}  // namespace sqbox

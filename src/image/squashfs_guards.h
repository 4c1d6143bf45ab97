// Checks around libsquashfuse for hostile images.
//
// Debian's libsquashfuse (0.1.105, linked from libsquashfuse-dev, not vendored) trusts the
// image's offsets and sizes. Fuzzing sqbox's reading code (tests/fuzz) found it reading and
// writing out of bounds, or dereferencing null, for images whose bytes were changed:
//  - a metadata cursor (an inode reference, a directory's start, a directory index entry) whose
//    offset lies past the end of its metadata block: memcpy reads beyond the block;
//  - a directory entry's name size (16 bits) or a directory index's (32 bits) larger than the
//    257-byte name buffer: the name is written past the buffer;
//  - an id, fragment or export table index beyond the table, or a table entry beyond its
//    metadata block: reads out of bounds;
//  - a data block or fragment shorter than the file's bytes it should hold, and the cached block
//    index of large files (keyed by the image's inode number, which may repeat): sqfs_read_range
//    copies beyond the block or follows a wrong index.
// sqbox therefore gets inodes only through checked_inode_get (which checks the inode and what
// the library will read from it later), lists directories with a DirEntryBuffer, and reads file
// data with checked_read_range instead of sqfs_read_range. The FUSE server numbers inodes by their
// references instead of through the library's numbering (which may read the export table).
#pragma once

#include <cstdint>
#include <memory>

#include "image/squashfuse_api.h"

namespace sqbox {

// sqfs_inode_get after checking that the reference points inside a metadata block, that the id
// table holds the inode's owner and group, and that what the inode leads to can be read without
// going out of bounds: a directory's start and index, a file's fragment entry, a symlink's
// target length (< 4096). SQFS_ERR for an inode that fails any check.
sqfs_err checked_inode_get(sqfs* fs, sqfs_inode* inode, sqfs_inode_id id);

// The image's root directory, checked (checked_inode_get).
sqfs_err checked_root_inode(sqfs* fs, sqfs_inode* inode);

// A directory entry whose name buffer holds any name size an image can state, so that
// sqfs_dir_next and sqfs_dir_lookup cannot write past it. name_ok() is false for a name longer
// than squashfs allows (SQUASHFS_NAME_LEN): the caller treats the directory as corrupt.
class DirEntryBuffer {
  public:
    DirEntryBuffer();
    sqfs_dir_entry* get() { return &entry_; }
    [[nodiscard]] bool name_ok() { return sqfs_dentry_name_size(&entry_) <= SQUASHFS_NAME_LEN; }

  private:
    sqfs_dir_entry entry_{};
    std::unique_ptr<char[]> name_;
};

// sqfs_read_range's contract (reads up to *size bytes of regular file `inode` from `start` into
// `buffer`; *size becomes the count read; SQFS_ERR if none could be read but some were asked for),
// with every block and fragment checked to hold the bytes taken from it.
sqfs_err checked_read_range(sqfs* fs, sqfs_inode* inode, sqfs_off_t start, sqfs_off_t* size,
                            void* buffer);

// An image was opened, perhaps where one closed earlier lay in memory (the fuzz targets open
// one image after another): a remembered block list position of the old one must not apply.
void forget_block_list_positions();

// The block list of regular file `inode`, advanced so that the next sqfs_blocklist_next gives
// the block holding byte `offset` (or none is left: the rest is a fragment tail). Replaces
// sqfs_blockidx_blocklist; remembers the last position so that sequential reads stay cheap.
sqfs_err checked_blocklist(sqfs* fs, sqfs_inode* inode, sqfs_blocklist* blocks, uint64_t offset);

}  // namespace sqbox

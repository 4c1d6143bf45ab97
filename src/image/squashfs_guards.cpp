#include "image/squashfs_guards.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

namespace sqbox {
namespace {

// The longest symlink target the kernel accepts (PATH_MAX with its NUL).
constexpr uint32_t kMaxSymlinkBytes = 4095;
// sqfs_dir_next reads a name of up to 65536 bytes (a 16-bit size plus one) and ends it with a NUL.
constexpr size_t kDirEntryNameBytes = 65536 + 1;

// Whether a metadata read starting at `offset` in the metadata block at image position `block`
// starts inside that block (libsquashfuse assumes it does).
bool metadata_position_ok(sqfs* fs, uint64_t block, uint64_t offset) {
    auto position = static_cast<sqfs_off_t>(block);
    if (position < 0) return false;
    sqfs_block* cached = nullptr;
    if (sqfs_md_cache(fs, &position, &cached) != SQFS_OK || cached == nullptr) return false;
    return offset < cached->size;
}

// Whether entry `index` of a table of `count` entries lies inside its metadata block.
bool table_entry_ok(sqfs* fs, const sqfs_table& table, uint64_t index, uint64_t count) {
    if (index >= count || table.blocks == nullptr || table.each == 0) return false;
    const uint64_t position = index * table.each;
    auto block_position = static_cast<sqfs_off_t>(table.blocks[position / SQUASHFS_METADATA_SIZE]);
    if (block_position < 0) return false;
    sqfs_block* cached = nullptr;
    if (sqfs_md_cache(fs, &block_position, &cached) != SQFS_OK || cached == nullptr) return false;
    return position % SQUASHFS_METADATA_SIZE + table.each <= cached->size;
}

bool base_inode_ok(sqfs* fs, sqfs_inode_id id) {
    if (!metadata_position_ok(fs, fs->sb.inode_table_start + (id >> 16), id & 0xffff)) {
        return false;
    }
    sqfs_md_cursor cursor;
    sqfs_md_cursor_inode(&cursor, id, static_cast<sqfs_off_t>(fs->sb.inode_table_start));
    squashfs_base_inode base{};
    if (sqfs_md_read(fs, &cursor, &base, sizeof base) != SQFS_OK) return false;
    return table_entry_ok(fs, fs->id_table, base.uid, fs->sb.no_ids) &&
           table_entry_ok(fs, fs->id_table, base.guid, fs->sb.no_ids);
}

// A directory's listing and index: where sqfs_dir_open, sqfs_dir_next and sqfs_dir_lookup will
// read.
bool directory_ok(sqfs* fs, sqfs_inode* inode) {
    // An empty directory is never read (its start may point past the table's last block).
    if (inode->xtra.dir.dir_size <= 3) return true;
    const uint64_t table = fs->sb.directory_table_start;
    if (!metadata_position_ok(fs, table + inode->xtra.dir.start_block, inode->xtra.dir.offset)) {
        return false;
    }
    sqfs_md_cursor cursor = inode->next;
    for (uint32_t i = 0; i < inode->xtra.dir.idx_count; ++i) {
        squashfs_dir_index index{};
        if (sqfs_md_read(fs, &cursor, &index, sizeof index) != SQFS_OK ||
            index.size >= SQUASHFS_NAME_LEN ||
            !metadata_position_ok(
                fs, table + index.start_block,
                (inode->xtra.dir.offset + uint64_t{index.index}) % SQUASHFS_METADATA_SIZE) ||
            sqfs_md_read(fs, &cursor, nullptr, index.size + 1) != SQFS_OK) {
            return false;
        }
    }
    return true;
}

// A data block or fragment block claims at most a block's size (the 24 size bits would let it
// claim 16 MiB, which the library would allocate and read).
bool stored_size_ok(sqfs* fs, uint32_t header) {
    bool compressed = false;
    uint32_t size = 0;
    sqfs_data_header(header, &compressed, &size);
    return size <= fs->sb.block_size;
}

bool fragment_ok(sqfs* fs, sqfs_inode* inode) {
    const uint32_t fragment = inode->xtra.reg.frag_idx;
    if (fragment == SQUASHFS_INVALID_FRAG) return true;
    squashfs_fragment_entry entry{};
    return table_entry_ok(fs, fs->frag_table, fragment, fs->sb.fragments) &&
           sqfs_frag_entry(fs, &entry, fragment) == SQFS_OK && stored_size_ok(fs, entry.size);
}

// The last block list position handed out, for sequential reads of one file.
struct BlockListMemo {
    sqfs* fs = nullptr;
    sqfs_md_cursor list{};     // the file's block list (the cursor after its inode)
    uint64_t start_block = 0;  // the file's first data block
    uint64_t file_size = 0;
    sqfs_blocklist state{};  // positioned before block `next_block`
    uint64_t next_block = 0;
};
thread_local BlockListMemo g_memo;

uint64_t next_block_index(const sqfs_blocklist& blocks, uint64_t block_size) {
    return blocks.started ? blocks.pos / block_size + 1 : 0;
}

}  // namespace

sqfs_err checked_inode_get(sqfs* fs, sqfs_inode* inode, sqfs_inode_id id) {
    if (!base_inode_ok(fs, id)) return SQFS_ERR;
    if (sqfs_inode_get(fs, inode, id) != SQFS_OK) return SQFS_ERR;
    const mode_t mode = inode->base.mode;
    if (S_ISDIR(mode) && !directory_ok(fs, inode)) return SQFS_ERR;
    if (S_ISREG(mode) && !fragment_ok(fs, inode)) return SQFS_ERR;
    if (S_ISLNK(mode) && inode->xtra.symlink_size > kMaxSymlinkBytes) return SQFS_ERR;
    return SQFS_OK;
}

sqfs_err checked_root_inode(sqfs* fs, sqfs_inode* inode) {
    return checked_inode_get(fs, inode, sqfs_inode_root(fs));
}

DirEntryBuffer::DirEntryBuffer() : name_(new char[kDirEntryNameBytes]) {
    sqfs_dentry_init(&entry_, name_.get());
}

sqfs_err checked_blocklist(sqfs* fs, sqfs_inode* inode, sqfs_blocklist* blocks, uint64_t offset) {
    if (!S_ISREG(inode->base.mode)) return SQFS_ERR;
    const uint64_t block_size = fs->sb.block_size;
    const uint64_t wanted = offset / block_size;
    sqfs_blocklist_init(fs, inode, blocks);
    BlockListMemo& memo = g_memo;
    if (memo.fs == fs && memo.list.block == inode->next.block &&
        memo.list.offset == inode->next.offset && memo.start_block == inode->xtra.reg.start_block &&
        memo.file_size == inode->xtra.reg.file_size && memo.next_block <= wanted) {
        *blocks = memo.state;
    }
    while (blocks->remain > 0 && next_block_index(*blocks, block_size) < wanted) {
        if (sqfs_blocklist_next(blocks) != SQFS_OK) return SQFS_ERR;
    }
    memo = {fs,
            inode->next,
            inode->xtra.reg.start_block,
            inode->xtra.reg.file_size,
            *blocks,
            next_block_index(*blocks, block_size)};
    return SQFS_OK;
}

void forget_block_list_positions() {
    g_memo = {};
}

sqfs_err checked_read_range(sqfs* fs, sqfs_inode* inode, sqfs_off_t start, sqfs_off_t* size,
                            void* buffer) {
    if (!S_ISREG(inode->base.mode) || start < 0 || *size < 0) return SQFS_ERR;
    const uint64_t file_size = inode->xtra.reg.file_size;
    const auto first = static_cast<uint64_t>(start);
    if (first > file_size) return SQFS_ERR;
    const uint64_t wanted = std::min<uint64_t>(static_cast<uint64_t>(*size), file_size - first);
    const uint64_t block_size = fs->sb.block_size;
    sqfs_blocklist blocks;
    if (checked_blocklist(fs, inode, &blocks, first) != SQFS_OK) return SQFS_ERR;
    auto* out = static_cast<char*>(buffer);
    uint64_t done = 0;
    while (done < wanted) {
        const uint64_t position = first + done;
        const char* data = nullptr;  // null: a hole, read as zeros
        uint64_t data_start = 0;     // the file position of data[0]
        uint64_t data_size = 0;
        if (blocks.remain > 0) {
            if (sqfs_blocklist_next(&blocks) != SQFS_OK) break;
            data_start = blocks.pos;
            if (data_start + block_size <= position) continue;
            if (data_start > position) break;  // a block list that does not describe the file
            data_size = std::min(block_size, file_size - data_start);
            if (blocks.input_size != 0) {
                if (!stored_size_ok(fs, blocks.header)) break;
                sqfs_block* block = nullptr;
                if (sqfs_data_cache(fs, &fs->data_cache, static_cast<sqfs_off_t>(blocks.block),
                                    blocks.header, &block) != SQFS_OK ||
                    block == nullptr || block->size < data_size) {
                    break;
                }
                data = static_cast<const char*>(block->data);
            }
        } else {
            // The tail, in a fragment (the inode's fragment entry was checked when it was read).
            if (inode->xtra.reg.frag_idx == SQUASHFS_INVALID_FRAG) break;
            size_t fragment_offset = 0;
            size_t fragment_size = 0;
            sqfs_block* block = nullptr;
            if (sqfs_frag_block(fs, inode, &fragment_offset, &fragment_size, &block) != SQFS_OK ||
                block == nullptr || fragment_offset > block->size ||
                fragment_size > block->size - fragment_offset) {
                break;
            }
            data_start = file_size - file_size % block_size;
            data_size = fragment_size;
            data = static_cast<const char*>(block->data) + fragment_offset;
            if (data_start > position) break;
        }
        if (data_start + data_size <= position) break;
        const uint64_t take = std::min(data_start + data_size - position, wanted - done);
        if (data != nullptr) {
            std::memcpy(out + done, data + (position - data_start), take);
        } else {
            std::memset(out + done, 0, take);
        }
        done += take;
    }
    *size = static_cast<sqfs_off_t>(done);
    return done > 0 || wanted == 0 ? SQFS_OK : SQFS_ERR;
}

}  // namespace sqbox

// What both squashfs writers (squashfs_writer.cpp for export, squashfs_builder.cpp for import)
// need from libsquashfs: ownership of its objects, error messages, and the steps every image takes
// in the same order (gensquashfs's layout): compressors, a placeholder superblock, the table
// writers and the data block processor first; inodes once all data is out; then the directory,
// fragment, export, ID (and xattr) tables and the final superblock.
#pragma once

#include <sqfs/compressor.h>
#include <sqfs/predef.h>
#include <sqfs/super.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace sqbox {

constexpr size_t kBlockSize = SQFS_DEFAULT_BLOCK_SIZE;  // 128 KiB
constexpr size_t kDeviceBlockSize = SQFS_DEVBLK_SIZE;   // mksquashfs pads images to 4 KiB
constexpr sqfs_u32 kNoXattrs = 0xFFFFFFFF;

struct SqfsDestroyer {
    void operator()(void* object) const { sqfs_destroy(object); }
};
template <typename T>
using SqfsObject = std::unique_ptr<T, SqfsDestroyer>;

// A writable sqfs_file_t over `fd` (borrowed: it must outlive the object, which never closes it):
// pread and pwrite at absolute offsets, so the image needs no path, and a process that may open
// no file at all can write it. Not copyable (libsquashfs expects that of writable files). Null when
// out of memory or when `fd` cannot be examined.
sqfs_file_t* make_descriptor_file(int fd);

// Inodes come from libsquashfs (released with sqfs_free) or from here (released with free).
void free_library_memory(void* memory);
void free_own_memory(void* memory);
using InodePtr = std::unique_ptr<sqfs_inode_generic_t, void (*)(void*)>;

// The inode of a symlink, char or block device (`device_number` in squashfs's encoding), FIFO or
// socket, by the file type in `mode`; null for any other type.
InodePtr make_special_inode(unsigned int mode, const std::string& link_target,
                            sqfs_u32 device_number, sqfs_u32 links);

// The kernel reads squashfs device numbers with new_decode_dev(): minor bits 0-7 and 20-31, major
// bits 8-19. Empty if the numbers do not fit.
std::optional<sqfs_u32> squashfs_device_number(unsigned int major_number,
                                               unsigned int minor_number);

const char* describe_sqfs_error(int code);

// squashfs stores unsigned 32-bit seconds.
sqfs_u32 squashfs_time(int64_t seconds);

// The libsquashfs objects that turn file data and inodes into one image, written into `file`
// (owned by the caller, who also removes it if the write fails). Set up in the order the objects
// depend on each other; the block processor, declared last, is destroyed first, so its workers
// stop before anything they write to goes away.
struct SquashfsWritePipeline {
    // `compression_level` 0 keeps the compressor's default; `message_context` starts every message.
    SquashfsWritePipeline(sqfs_file_t* image_file, SQFS_COMPRESSOR compressor_id,
                          int compression_level, std::string context);

    // Throws an Error "<context>: <operation>: <what went wrong>" unless `result` is 0.
    void check(int result, const std::string& operation) const;

    // Ends the directory begun on directory_writer (its entries added) and makes its inode.
    InodePtr finish_directory_inode(sqfs_u32 parent_number, sqfs_u32 subdirectories,
                                    const std::string& what);
    // Appends the inode, with its owners, to the inode table; returns its reference.
    sqfs_u64 write_inode(sqfs_inode_generic_t& inode, sqfs_u32 uid, sqfs_u32 gid,
                         const std::string& what);
    // Writes everything after the inode table and completes the superblock. `xattrs` may be null:
    // no xattr table then (the caller decides on SQFS_FLAG_NO_XATTRS).
    void write_tables(sqfs_u32 root_number, sqfs_u64 root_ref, sqfs_xattr_writer_t* xattrs);

    std::string context;
    sqfs_file_t* file;
    SqfsObject<sqfs_compressor_t> compressor;
    SqfsObject<sqfs_compressor_t> decompressor;  // reads fragments back to deduplicate them
    sqfs_super_t super{};
    SqfsObject<sqfs_block_writer_t> block_writer;
    SqfsObject<sqfs_frag_table_t> fragment_table;
    SqfsObject<sqfs_id_table_t> id_table;
    SqfsObject<sqfs_meta_writer_t> inode_table;
    SqfsObject<sqfs_meta_writer_t> directory_table;
    SqfsObject<sqfs_dir_writer_t> directory_writer;
    SqfsObject<sqfs_block_processor_t> block_processor;

  private:
    void create_compressors(SQFS_COMPRESSOR compressor_id, int compression_level);
    void reserve_superblock(SQFS_COMPRESSOR compressor_id);
    void create_table_writers();
    void create_block_processor();
    void pad_to_device_block();
    [[nodiscard]] sqfs_u64 file_size() const;
};

}  // namespace sqbox

// Building a squashfs image from a tree held in memory (metadata only) whose file data arrives as
// streams, in any order: what `sqbox import` needs to turn image layers into one image without
// unpacking them to disk. Unlike write_squashfs_image (a directory on disk, all-root, hard links
// as copies), it keeps owners, hard links (one inode, several names) and extended attributes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct sqfs_inode_generic_t;  // libsquashfs

namespace sqbox {

// lz4 is left out: Debian's libsquashfs 1.2.0 writes lz4 images whose tables unsquashfs cannot
// read back.
enum class SquashfsCompression { none, gzip, zstd, xz };

// "zstd", "gzip", "xz" or "none"; throws Error for anything else.
SquashfsCompression parse_squashfs_compression(const std::string& name);

// One inode. Several entries share one for hard links.
struct SquashfsInode {
    SquashfsInode() = default;
    SquashfsInode(const SquashfsInode&) = delete;
    SquashfsInode& operator=(const SquashfsInode&) = delete;
    ~SquashfsInode();

    uint16_t mode = 0;  // file type and permission bits, as in st_mode
    uint32_t uid = 0;
    uint32_t gid = 0;
    int64_t mtime = 0;
    unsigned int device_major = 0;  // char and block devices
    unsigned int device_minor = 0;
    std::string link_target;                                  // symlinks
    std::vector<std::pair<std::string, std::string>> xattrs;  // user., trusted., security. only
    // For the builder's user (the import): where the file's data comes from.
    size_t data_layer = 0;
    uint64_t data_entry = 0;
    uint64_t data_size = 0;

    // Set by SquashfsBuilder: the file inode its data writer completed, then the inode's place.
    sqfs_inode_generic_t* file_inode = nullptr;
    uint32_t link_count = 0;
    uint32_t inode_number = 0;
    uint64_t inode_ref = 0;
    bool written = false;
};

// One directory entry (the root has an empty name).
struct SquashfsEntry {
    std::shared_ptr<SquashfsInode> inode;
    std::map<std::string, std::unique_ptr<SquashfsEntry>> children;  // directories; byte order
    size_t layer = 0;  // for the builder's user: the layer that last set this entry
};

struct SquashfsBuildOptions {
    SquashfsCompression compression = SquashfsCompression::zstd;
};

// Writes one image: file data first (begin_file / append / end_file, one file at a time, in any
// order), then finish() with the tree. The image goes into `output_fd` (borrowed; an empty regular
// file open for reading and writing), by descriptor only: the writer opens no path, so it can run
// in a process that may open none (import/image_import.cpp). The caller removes the file when
// finish() did not complete; `name` is for messages.
class SquashfsBuilder {
  public:
    SquashfsBuilder(int output_fd, const std::string& name, const SquashfsBuildOptions& options);
    SquashfsBuilder(const SquashfsBuilder&) = delete;
    SquashfsBuilder& operator=(const SquashfsBuilder&) = delete;
    ~SquashfsBuilder();

    void begin_file(SquashfsInode& inode);
    void append(const void* data, size_t size);
    void end_file();
    // Every regular file of the tree must have had its data written (an empty file may skip it).
    void finish(SquashfsEntry& root);

  private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace sqbox

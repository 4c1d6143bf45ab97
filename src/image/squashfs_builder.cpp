// The layout is squashfs_writer.cpp's (after gensquashfs): data through the block processor first,
// then inodes children before parents, the directory table, the fragment, export, ID and xattr
// tables, and the superblock last. What differs: the tree is given, not walked, inodes may be
// shared by several entries (hard links, counted in extended inodes) and carry xattrs and owners.
#include "image/squashfs_builder.h"

#include <sqfs/block.h>
#include <sqfs/block_processor.h>
#include <sqfs/dir_writer.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/xattr_writer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "image/libsquashfs_support.h"
#include "util/errors.h"

namespace sqbox {
namespace {

SQFS_COMPRESSOR library_compressor(SquashfsCompression compression) {
    switch (compression) {
        case SquashfsCompression::gzip:
            return SQFS_COMP_GZIP;
        case SquashfsCompression::xz:
            return SQFS_COMP_XZ;
        case SquashfsCompression::zstd:
        case SquashfsCompression::none:  // the tables still need a compressor
            break;
    }
    return SQFS_COMP_ZSTD;
}

// zstd at level 6 takes a fraction of the default's (15) time; 0 keeps the others' defaults.
int compression_level(SQFS_COMPRESSOR compressor) {
    return compressor == SQFS_COMP_ZSTD ? 6 : 0;
}

}  // namespace

SquashfsCompression parse_squashfs_compression(const std::string& name) {
    if (name == "gzip") return SquashfsCompression::gzip;
    if (name == "zstd") return SquashfsCompression::zstd;
    if (name == "xz") return SquashfsCompression::xz;
    if (name == "none") return SquashfsCompression::none;
    throw Error("unknown squashfs compression '" + name + "' (zstd, gzip, xz or none)");
}

SquashfsInode::~SquashfsInode() {
    sqfs_free(file_inode);
}

class SquashfsBuilder::Impl {
  public:
    Impl(int output_fd, const std::string& name, const SquashfsBuildOptions& options);
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
    ~Impl() = default;

    void begin_file(SquashfsInode& inode);
    void append(const void* data, size_t size);
    void end_file();
    void finish(SquashfsEntry& root);

  private:
    sqfs_file_t* open_image_file(int output_fd);
    void write_empty_files(SquashfsEntry& directory, const std::string& path);
    void count_links(SquashfsEntry& directory);
    void number_inodes(SquashfsEntry& directory);
    void write_inodes_below(SquashfsEntry& directory, const std::string& path);
    void write_inode(SquashfsEntry& entry, sqfs_u32 parent_number, const std::string& path);
    InodePtr make_directory_inode(const SquashfsEntry& directory, sqfs_u32 parent_number,
                                  const std::string& path);
    static InodePtr make_other_inode(const SquashfsInode& node, const std::string& path);
    sqfs_u32 xattr_index(const SquashfsInode& node, const std::string& path);
    void check(int result, const std::string& operation) const;

    std::string context_;
    SqfsObject<sqfs_file_t> file_;
    SqfsObject<sqfs_xattr_writer_t> xattr_writer_;
    SquashfsWritePipeline pipeline_;
    sqfs_u32 block_flags_ = 0;
    bool any_xattrs_ = false;
    sqfs_u32 inode_count_ = 0;
};

SquashfsBuilder::Impl::Impl(int output_fd, const std::string& name,
                            const SquashfsBuildOptions& options)
    : context_("writing squashfs image " + name),
      file_(open_image_file(output_fd)),
      xattr_writer_(sqfs_xattr_writer_create(0)),
      pipeline_(file_.get(), library_compressor(options.compression),
                compression_level(library_compressor(options.compression)), context_) {
    if (!xattr_writer_) throw Error(context_ + ": out of memory creating the table writers");
    if (options.compression == SquashfsCompression::none) {
        block_flags_ = SQFS_BLK_DONT_COMPRESS;
        pipeline_.super.flags |= SQFS_FLAG_UNCOMPRESSED_DATA | SQFS_FLAG_UNCOMPRESSED_FRAGMENTS;
    }
}

sqfs_file_t* SquashfsBuilder::Impl::open_image_file(int output_fd) {
    sqfs_file_t* file = make_descriptor_file(output_fd);
    if (file == nullptr) throw system_error(context_ + ": cannot use the image file");
    return file;
}

void SquashfsBuilder::Impl::begin_file(SquashfsInode& inode) {
    if (inode.file_inode != nullptr) throw Error(context_ + ": a file's data written twice");
    check(sqfs_block_processor_begin_file(pipeline_.block_processor.get(), &inode.file_inode,
                                          nullptr, block_flags_),
          "starting a file's data");
}

void SquashfsBuilder::Impl::append(const void* data, size_t size) {
    check(sqfs_block_processor_append(pipeline_.block_processor.get(), data, size),
          "packing file data");
}

void SquashfsBuilder::Impl::end_file() {
    check(sqfs_block_processor_end_file(pipeline_.block_processor.get()),
          "finishing a file's data");
}

void SquashfsBuilder::Impl::finish(SquashfsEntry& root) {
    write_empty_files(root, "");
    check(sqfs_block_processor_finish(pipeline_.block_processor.get()),
          "writing the last data blocks");
    root.inode->link_count = 1;
    count_links(root);
    number_inodes(root);
    if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
        throw Error(context_ + ": too many files for squashfs");
    }
    root.inode->inode_number = ++inode_count_;
    pipeline_.super.inode_count = inode_count_;
    pipeline_.super.modification_time = squashfs_time(root.inode->mtime);
    pipeline_.super.inode_table_start = file_->get_size(file_.get());
    write_inodes_below(root, "");
    // As mksquashfs does: the root's ".." points one past the last inode, never at inode 0.
    write_inode(root, inode_count_ + 1, "/");
    pipeline_.super.root_inode_ref = root.inode->inode_ref;
    if (!any_xattrs_) pipeline_.super.flags |= SQFS_FLAG_NO_XATTRS;
    pipeline_.write_tables(root.inode->inode_number, root.inode->inode_ref,
                           any_xattrs_ ? xattr_writer_.get() : nullptr);
}

void SquashfsBuilder::Impl::write_empty_files(SquashfsEntry& directory, const std::string& path) {
    for (auto& [name, child] : directory.children) {
        SquashfsInode& inode = *child->inode;
        const std::string child_path = path + "/" + name;
        if (S_ISDIR(inode.mode)) {
            write_empty_files(*child, child_path);
        } else if (S_ISREG(inode.mode) && inode.file_inode == nullptr) {
            if (inode.data_size != 0) {
                throw Error(context_ + ": the data of " + child_path + " was never written");
            }
            begin_file(inode);
            end_file();
        }
    }
}

void SquashfsBuilder::Impl::count_links(SquashfsEntry& directory) {
    for (auto& [name, child] : directory.children) {
        SquashfsInode& inode = *child->inode;
        if (inode.link_count == std::numeric_limits<uint32_t>::max()) {
            throw Error(context_ + ": too many hard links to one file");
        }
        ++inode.link_count;
        if (S_ISDIR(inode.mode)) count_links(*child);
    }
}

// A directory's children get consecutive numbers after everything below its subdirectories, so
// every inode is numbered, and written, before its parent. A hard-linked inode keeps the number it
// got first.
void SquashfsBuilder::Impl::number_inodes(SquashfsEntry& directory) {
    for (auto& [name, child] : directory.children) {
        if (S_ISDIR(child->inode->mode)) number_inodes(*child);
    }
    for (auto& [name, child] : directory.children) {
        if (child->inode->inode_number != 0) continue;
        if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
            throw Error(context_ + ": too many files for squashfs");
        }
        child->inode->inode_number = ++inode_count_;
    }
}

void SquashfsBuilder::Impl::write_inodes_below(SquashfsEntry& directory, const std::string& path) {
    for (auto& [name, child] : directory.children) {
        if (S_ISDIR(child->inode->mode)) write_inodes_below(*child, path + "/" + name);
    }
    for (auto& [name, child] : directory.children) {
        if (!child->inode->written) {
            write_inode(*child, directory.inode->inode_number, path + "/" + name);
        }
    }
}

void SquashfsBuilder::Impl::write_inode(SquashfsEntry& entry, sqfs_u32 parent_number,
                                        const std::string& path) {
    SquashfsInode& node = *entry.inode;
    InodePtr inode(nullptr, &free_library_memory);
    if (S_ISDIR(node.mode)) {
        inode = make_directory_inode(entry, parent_number, path);
    } else if (S_ISREG(node.mode)) {
        inode = InodePtr(std::exchange(node.file_inode, nullptr), &free_library_memory);
        if (node.link_count > 1) {
            check(sqfs_inode_make_extended(inode.get()), "extending the inode of " + path);
            inode->data.file_ext.nlink = node.link_count;
        }
    } else {
        inode = make_other_inode(node, path);
    }
    inode->base.mode = node.mode;
    inode->base.mod_time = squashfs_time(node.mtime);
    inode->base.inode_number = node.inode_number;
    const std::string what = "writing the inode of " + path;
    check(sqfs_inode_set_xattr_index(inode.get(), xattr_index(node, path)), what);
    node.inode_ref = pipeline_.write_inode(*inode, node.uid, node.gid, what);
    node.written = true;
}

sqfs_u32 SquashfsBuilder::Impl::xattr_index(const SquashfsInode& node, const std::string& path) {
    if (node.xattrs.empty()) return kNoXattrs;
    const std::string what = "writing the extended attributes of " + path;
    check(sqfs_xattr_writer_begin(xattr_writer_.get(), 0), what);
    for (const auto& [key, value] : node.xattrs) {
        check(sqfs_xattr_writer_add(xattr_writer_.get(), key.c_str(), value.data(), value.size()),
              what + " (" + key + ")");
    }
    sqfs_u32 index = kNoXattrs;
    check(sqfs_xattr_writer_end(xattr_writer_.get(), &index), what);
    any_xattrs_ = true;
    return index;
}

InodePtr SquashfsBuilder::Impl::make_directory_inode(const SquashfsEntry& directory,
                                                     sqfs_u32 parent_number,
                                                     const std::string& path) {
    const std::string what = "writing directory " + path;
    sqfs_dir_writer_t* writer = pipeline_.directory_writer.get();
    check(sqfs_dir_writer_begin(writer, 0), what);
    sqfs_u32 subdirectories = 0;
    for (const auto& [name, child] : directory.children) {
        const SquashfsInode& inode = *child->inode;
        check(sqfs_dir_writer_add_entry(writer, name.c_str(), inode.inode_number, inode.inode_ref,
                                        inode.mode),
              what);
        if (S_ISDIR(inode.mode)) ++subdirectories;
    }
    return pipeline_.finish_directory_inode(parent_number, subdirectories, what);
}

InodePtr SquashfsBuilder::Impl::make_other_inode(const SquashfsInode& node,
                                                 const std::string& path) {
    sqfs_u32 device_number = 0;
    if (S_ISCHR(node.mode) || S_ISBLK(node.mode)) {
        const std::optional<sqfs_u32> encoded =
            squashfs_device_number(node.device_major, node.device_minor);
        if (!encoded) throw Error("device number of " + path + " does not fit in squashfs");
        device_number = *encoded;
    }
    InodePtr inode = make_special_inode(node.mode, node.link_target, device_number,
                                        std::max<sqfs_u32>(node.link_count, 1));
    if (!inode) throw Error(path + " has an unknown file type");
    return inode;
}

void SquashfsBuilder::Impl::check(int result, const std::string& operation) const {
    pipeline_.check(result, operation);
}

SquashfsBuilder::SquashfsBuilder(int output_fd, const std::string& name,
                                 const SquashfsBuildOptions& options)
    : impl_(std::make_unique<Impl>(output_fd, name, options)) {}
SquashfsBuilder::~SquashfsBuilder() = default;
void SquashfsBuilder::begin_file(SquashfsInode& inode) {
    impl_->begin_file(inode);
}
void SquashfsBuilder::append(const void* data, size_t size) {
    impl_->append(data, size);
}
void SquashfsBuilder::end_file() {
    impl_->end_file();
}
void SquashfsBuilder::finish(SquashfsEntry& root) {
    impl_->finish(root);
}

}  // namespace sqbox

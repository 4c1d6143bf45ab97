// The layout is squashfs_writer.cpp's (after gensquashfs): data through the block processor first,
// then inodes children before parents, the directory table, the fragment, export, ID and xattr
// tables, and the superblock last. What differs: the tree is given, not walked, inodes may be
// shared by several entries (hard links, counted in extended inodes) and carry xattrs and owners.
#include "image/squashfs_builder.h"

#include <sched.h>
#include <sqfs/block.h>
#include <sqfs/block_processor.h>
#include <sqfs/block_writer.h>
#include <sqfs/compressor.h>
#include <sqfs/dir_writer.h>
#include <sqfs/error.h>
#include <sqfs/frag_table.h>
#include <sqfs/id_table.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/meta_writer.h>
#include <sqfs/super.h>
#include <sqfs/xattr_writer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "util/errors.h"

namespace sqbox {
namespace {

constexpr size_t kBlockSize = SQFS_DEFAULT_BLOCK_SIZE;  // 128 KiB
constexpr size_t kDeviceBlockSize = SQFS_DEVBLK_SIZE;   // mksquashfs pads images to 4 KiB
constexpr sqfs_u32 kNoXattrs = 0xFFFFFFFF;

struct SqfsDestroyer {
    void operator()(void* object) const { sqfs_destroy(object); }
};
template <typename T>
using SqfsObject = std::unique_ptr<T, SqfsDestroyer>;

void free_library_memory(void* memory) {
    sqfs_free(memory);
}
void free_own_memory(void* memory) {
    std::free(memory);
}
using InodePtr = std::unique_ptr<sqfs_inode_generic_t, void (*)(void*)>;

const char* describe_sqfs_error(int code) {
    switch (code) {
        case SQFS_ERROR_ALLOC:
            return "out of memory";
        case SQFS_ERROR_IO:
            return "input/output error";
        case SQFS_ERROR_COMPRESSOR:
            return "compressor failure";
        case SQFS_ERROR_UNSUPPORTED:
            return "unsupported by libsquashfs";
        case SQFS_ERROR_OVERFLOW:
            return "too large for squashfs";
        case SQFS_ERROR_ARG_INVALID:
            return "invalid argument";
        case SQFS_ERROR_SEQUENCE:
            return "libsquashfs calls out of sequence";
        default:
            return "libsquashfs error";
    }
}

sqfs_u32 squashfs_time(int64_t seconds) {
    return static_cast<sqfs_u32>(
        std::clamp<int64_t>(seconds, 0, std::numeric_limits<sqfs_u32>::max()));
}

unsigned int worker_count() {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (::sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
    return static_cast<unsigned int>(std::max(1, CPU_COUNT(&cpus)));
}

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
    Impl(const std::string& output_path, const SquashfsBuildOptions& options);
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
    ~Impl() = default;

    void begin_file(SquashfsInode& inode);
    void append(const void* data, size_t size);
    void end_file();
    void finish(SquashfsEntry& root);

  private:
    void create_compressors(const SquashfsBuildOptions& options);
    void create_block_processor();
    void write_empty_files(SquashfsEntry& directory, const std::string& path);
    void count_links(SquashfsEntry& directory);
    void number_inodes(SquashfsEntry& directory);
    void write_inodes_below(SquashfsEntry& directory, const std::string& path);
    void write_inode(SquashfsEntry& entry, sqfs_u32 parent_number, const std::string& path);
    InodePtr make_directory_inode(const SquashfsEntry& directory, sqfs_u32 parent_number,
                                  const std::string& path);
    static InodePtr make_other_inode(const SquashfsInode& node, const std::string& path);
    sqfs_u32 xattr_index(const SquashfsInode& node, const std::string& path);
    void write_tables(const SquashfsInode& root);
    void check(int result, const std::string& operation) const;

    // Removes the image file it created unless the write completed (also when a constructor
    // throws), after everything else here is gone.
    struct OutputGuard {
        OutputGuard() = default;
        OutputGuard(const OutputGuard&) = delete;
        OutputGuard& operator=(const OutputGuard&) = delete;
        ~OutputGuard() {
            // Nobody is left to report a failed cleanup to; the write's own error is thrown.
            if (!path.empty() && !complete) (void)::unlink(path.c_str());
        }
        std::string path;  // set once the file is ours
        bool complete = false;
    };

    std::string context_;
    OutputGuard output_guard_;
    SqfsObject<sqfs_file_t> file_;
    SqfsObject<sqfs_compressor_t> compressor_;
    SqfsObject<sqfs_compressor_t> decompressor_;
    sqfs_u32 block_flags_ = 0;
    sqfs_super_t super_{};
    SqfsObject<sqfs_block_writer_t> block_writer_;
    SqfsObject<sqfs_frag_table_t> fragment_table_;
    SqfsObject<sqfs_id_table_t> id_table_;
    SqfsObject<sqfs_xattr_writer_t> xattr_writer_;
    SqfsObject<sqfs_meta_writer_t> inode_table_;
    SqfsObject<sqfs_meta_writer_t> directory_table_;
    SqfsObject<sqfs_dir_writer_t> directory_writer_;
    // Last, so destroyed first: its workers stop before anything they write to goes away.
    SqfsObject<sqfs_block_processor_t> block_processor_;
    bool any_xattrs_ = false;
    sqfs_u32 inode_count_ = 0;
};

SquashfsBuilder::Impl::Impl(const std::string& output_path, const SquashfsBuildOptions& options)
    : context_("writing squashfs image " + output_path) {
    file_.reset(sqfs_open_file(output_path.c_str(), 0));  // no OVERWRITE flag: O_CREAT | O_EXCL
    if (!file_) throw system_error(context_ + ": cannot create the image file");
    output_guard_.path = output_path;
    create_compressors(options);
    check(sqfs_super_init(&super_, kBlockSize, 0, library_compressor(options.compression)),
          "initializing the superblock");
    check(sqfs_super_write(&super_, file_.get()), "writing the superblock");
    int written = compressor_->write_options(compressor_.get(), file_.get());
    if (written < 0) check(written, "writing the compressor options");
    if (written > 0) super_.flags |= SQFS_FLAG_COMPRESSOR_OPTIONS;
    if (options.compression == SquashfsCompression::none) {
        block_flags_ = SQFS_BLK_DONT_COMPRESS;
        super_.flags |= SQFS_FLAG_UNCOMPRESSED_DATA | SQFS_FLAG_UNCOMPRESSED_FRAGMENTS;
    }
    block_writer_.reset(sqfs_block_writer_create(file_.get(), kDeviceBlockSize, 0));
    fragment_table_.reset(sqfs_frag_table_create(0));
    id_table_.reset(sqfs_id_table_create(0));
    xattr_writer_.reset(sqfs_xattr_writer_create(0));
    inode_table_.reset(sqfs_meta_writer_create(file_.get(), compressor_.get(), 0));
    directory_table_.reset(
        sqfs_meta_writer_create(file_.get(), compressor_.get(), SQFS_META_WRITER_KEEP_IN_MEMORY));
    if (!block_writer_ || !fragment_table_ || !id_table_ || !xattr_writer_ || !inode_table_ ||
        !directory_table_) {
        throw Error(context_ + ": out of memory creating the table writers");
    }
    directory_writer_.reset(
        sqfs_dir_writer_create(directory_table_.get(), SQFS_DIR_WRITER_CREATE_EXPORT_TABLE));
    if (!directory_writer_) throw Error(context_ + ": out of memory creating the directory writer");
    create_block_processor();
}

void SquashfsBuilder::Impl::create_compressors(const SquashfsBuildOptions& options) {
    sqfs_compressor_config_t config{};
    const SQFS_COMPRESSOR id = library_compressor(options.compression);
    check(sqfs_compressor_config_init(&config, id, kBlockSize, 0), "configuring the compressor");
    if (id == SQFS_COMP_ZSTD) config.level = 6;  // a fraction of the default's (15) time
    sqfs_compressor_t* compressor = nullptr;
    check(sqfs_compressor_create(&config, &compressor), "creating the compressor");
    compressor_.reset(compressor);
    config.flags |= SQFS_COMP_FLAG_UNCOMPRESS;
    sqfs_compressor_t* decompressor = nullptr;
    check(sqfs_compressor_create(&config, &decompressor), "creating the decompressor");
    decompressor_.reset(decompressor);
}

void SquashfsBuilder::Impl::create_block_processor() {
    unsigned int workers = worker_count();
    sqfs_block_processor_desc_t description{};
    description.size = sizeof description;
    description.max_block_size = kBlockSize;
    description.num_workers = workers;
    description.max_backlog = 10 * workers;
    description.cmp = compressor_.get();
    description.wr = block_writer_.get();
    description.tbl = fragment_table_.get();
    description.file = file_.get();
    description.uncmp = decompressor_.get();
    sqfs_block_processor_t* processor = nullptr;
    check(sqfs_block_processor_create_ex(&description, &processor),
          "creating the data block processor");
    block_processor_.reset(processor);
}

void SquashfsBuilder::Impl::begin_file(SquashfsInode& inode) {
    if (inode.file_inode != nullptr) throw Error(context_ + ": a file's data written twice");
    check(sqfs_block_processor_begin_file(block_processor_.get(), &inode.file_inode, nullptr,
                                          block_flags_),
          "starting a file's data");
}

void SquashfsBuilder::Impl::append(const void* data, size_t size) {
    check(sqfs_block_processor_append(block_processor_.get(), data, size), "packing file data");
}

void SquashfsBuilder::Impl::end_file() {
    check(sqfs_block_processor_end_file(block_processor_.get()), "finishing a file's data");
}

void SquashfsBuilder::Impl::finish(SquashfsEntry& root) {
    write_empty_files(root, "");
    check(sqfs_block_processor_finish(block_processor_.get()), "writing the last data blocks");
    root.inode->link_count = 1;
    count_links(root);
    number_inodes(root);
    if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
        throw Error(context_ + ": too many files for squashfs");
    }
    root.inode->inode_number = ++inode_count_;
    super_.inode_count = inode_count_;
    super_.modification_time = squashfs_time(root.inode->mtime);
    super_.inode_table_start = file_->get_size(file_.get());
    write_inodes_below(root, "");
    // As mksquashfs does: the root's ".." points one past the last inode, never at inode 0.
    write_inode(root, inode_count_ + 1, "/");
    super_.root_inode_ref = root.inode->inode_ref;
    write_tables(*root.inode);
    output_guard_.complete = true;
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
    check(sqfs_id_table_id_to_index(id_table_.get(), node.uid, &inode->base.uid_idx), what);
    check(sqfs_id_table_id_to_index(id_table_.get(), node.gid, &inode->base.gid_idx), what);
    sqfs_u64 block = 0;
    sqfs_u32 offset = 0;
    sqfs_meta_writer_get_position(inode_table_.get(), &block, &offset);
    node.inode_ref = (block << 16) | offset;
    check(sqfs_meta_writer_write_inode(inode_table_.get(), inode.get()), what);
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
    sqfs_dir_writer_t* writer = directory_writer_.get();
    check(sqfs_dir_writer_begin(writer, 0), what);
    sqfs_u32 subdirectories = 0;
    for (const auto& [name, child] : directory.children) {
        const SquashfsInode& inode = *child->inode;
        check(sqfs_dir_writer_add_entry(writer, name.c_str(), inode.inode_number, inode.inode_ref,
                                        inode.mode),
              what);
        if (S_ISDIR(inode.mode)) ++subdirectories;
    }
    check(sqfs_dir_writer_end(writer), what);
    InodePtr inode(sqfs_dir_writer_create_inode(writer, 0, kNoXattrs, parent_number),
                   &free_library_memory);
    if (!inode) throw Error(context_ + ": out of memory " + what);
    sqfs_u32 links = 2 + subdirectories;  // POSIX: "." and each subdirectory's ".."
    if (inode->base.type == SQFS_INODE_DIR) {
        inode->data.dir.nlink = links;
    } else {
        inode->data.dir_ext.nlink = links;
    }
    return inode;
}

InodePtr SquashfsBuilder::Impl::make_other_inode(const SquashfsInode& node,
                                                 const std::string& path) {
    const size_t target_size = node.link_target.size();
    void* memory = std::calloc(1, sizeof(sqfs_inode_generic_t) + target_size);
    if (memory == nullptr) throw std::bad_alloc();
    InodePtr inode(static_cast<sqfs_inode_generic_t*>(memory), &free_own_memory);
    const sqfs_u32 links = std::max<sqfs_u32>(node.link_count, 1);
    switch (node.mode & S_IFMT) {
        case S_IFLNK:
            inode->base.type = SQFS_INODE_SLINK;
            inode->data.slink.nlink = links;
            inode->data.slink.target_size = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_available = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_used = static_cast<sqfs_u32>(target_size);
            std::memcpy(inode->extra, node.link_target.data(), target_size);
            break;
        case S_IFCHR:
        case S_IFBLK: {
            // The kernel's new_decode_dev(): minor bits 0-7 and 20-31, major bits 8-19.
            if (node.device_major > 0xfff || node.device_minor > 0xfffff) {
                throw Error("device number of " + path + " does not fit in squashfs");
            }
            inode->base.type = S_ISCHR(node.mode) ? SQFS_INODE_CDEV : SQFS_INODE_BDEV;
            inode->data.dev.nlink = links;
            inode->data.dev.devno = (node.device_minor & 0xffU) | (node.device_major << 8) |
                                    ((node.device_minor & ~0xffU) << 12);
            break;
        }
        case S_IFIFO:
        case S_IFSOCK:
            inode->base.type = S_ISFIFO(node.mode) ? SQFS_INODE_FIFO : SQFS_INODE_SOCKET;
            inode->data.ipc.nlink = links;
            break;
        default:
            throw Error(path + " has an unknown file type");
    }
    return inode;
}

void SquashfsBuilder::Impl::write_tables(const SquashfsInode& root) {
    check(sqfs_meta_writer_flush(inode_table_.get()), "writing the inode table");
    check(sqfs_meta_writer_flush(directory_table_.get()), "writing the directory table");
    super_.directory_table_start = file_->get_size(file_.get());
    check(sqfs_meta_write_write_to_file(directory_table_.get()), "writing the directory table");
    check(sqfs_frag_table_write(fragment_table_.get(), file_.get(), &super_, compressor_.get()),
          "writing the fragment table");
    check(
        sqfs_dir_writer_write_export_table(directory_writer_.get(), file_.get(), compressor_.get(),
                                           root.inode_number, root.inode_ref, &super_),
        "writing the export table");
    check(sqfs_id_table_write(id_table_.get(), file_.get(), &super_, compressor_.get()),
          "writing the ID table");
    if (any_xattrs_) {
        check(sqfs_xattr_writer_flush(xattr_writer_.get(), file_.get(), &super_, compressor_.get()),
              "writing the extended attribute table");
    } else {
        super_.flags |= SQFS_FLAG_NO_XATTRS;
    }
    super_.bytes_used = file_->get_size(file_.get());
    check(sqfs_super_write(&super_, file_.get()), "writing the superblock");
    const sqfs_u64 size = super_.bytes_used;
    const size_t remainder = size % kDeviceBlockSize;
    if (remainder != 0) {
        std::vector<std::byte> zeros(kDeviceBlockSize - remainder);
        check(file_->write_at(file_.get(), size, zeros.data(), zeros.size()), "padding the image");
    }
}

void SquashfsBuilder::Impl::check(int result, const std::string& operation) const {
    if (result == 0) return;
    const int saved_errno = errno;
    std::string message = context_ + ": " + operation + ": " + describe_sqfs_error(result);
    if (result == SQFS_ERROR_IO && saved_errno != 0) {
        message += std::string(" (") + std::strerror(saved_errno) + ")";
    }
    throw Error(message, result == SQFS_ERROR_IO ? saved_errno : 0);
}

SquashfsBuilder::SquashfsBuilder(const std::string& output_path,
                                 const SquashfsBuildOptions& options)
    : impl_(std::make_unique<Impl>(output_path, options)) {}
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

#include "image/libsquashfs_support.h"

#include <sched.h>
#include <sqfs/block_processor.h>
#include <sqfs/block_writer.h>
#include <sqfs/dir_writer.h>
#include <sqfs/error.h>
#include <sqfs/frag_table.h>
#include <sqfs/id_table.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/meta_writer.h>
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
#include <vector>

#include "util/errors.h"

namespace sqbox {
namespace {

// Threads the compressor may use: the CPUs this process may run on.
unsigned int worker_count() {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (::sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
    return static_cast<unsigned int>(std::max(1, CPU_COUNT(&cpus)));
}

// libsquashfs's interface over a descriptor; the size is kept here, as the library's own
// implementation does, since only this object writes the file.
struct DescriptorFile {
    sqfs_file_t base{};  // first: libsquashfs hands back a pointer to it
    int fd = -1;
    sqfs_u64 size = 0;
};

DescriptorFile* descriptor_file(sqfs_file_t* file) {
    return reinterpret_cast<DescriptorFile*>(file);
}

int descriptor_read_at(sqfs_file_t* file, sqfs_u64 offset, void* buffer, size_t size) {
    const DescriptorFile& self = *descriptor_file(file);
    if (offset > self.size || size > self.size - offset) return SQFS_ERROR_OUT_OF_BOUNDS;
    auto* bytes = static_cast<char*>(buffer);
    while (size > 0) {
        const ssize_t got = ::pread(self.fd, bytes, size, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return SQFS_ERROR_IO;
        if (got == 0) return SQFS_ERROR_OUT_OF_BOUNDS;
        bytes += got;
        size -= static_cast<size_t>(got);
        offset += static_cast<sqfs_u64>(got);
    }
    return 0;
}

int descriptor_write_at(sqfs_file_t* file, sqfs_u64 offset, const void* buffer, size_t size) {
    DescriptorFile& self = *descriptor_file(file);
    const auto* bytes = static_cast<const char*>(buffer);
    sqfs_u64 position = offset;
    size_t left = size;
    while (left > 0) {
        const ssize_t put = ::pwrite(self.fd, bytes, left, static_cast<off_t>(position));
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return SQFS_ERROR_IO;
        bytes += put;
        left -= static_cast<size_t>(put);
        position += static_cast<sqfs_u64>(put);
    }
    self.size = std::max(self.size, offset + size);
    return 0;
}

sqfs_u64 descriptor_get_size(const sqfs_file_t* file) {
    return reinterpret_cast<const DescriptorFile*>(file)->size;
}

int descriptor_truncate(sqfs_file_t* file, sqfs_u64 size) {
    DescriptorFile& self = *descriptor_file(file);
    if (::ftruncate(self.fd, static_cast<off_t>(size)) != 0) return SQFS_ERROR_IO;
    self.size = size;
    return 0;
}

void descriptor_destroy(sqfs_object_t* object) {
    delete reinterpret_cast<DescriptorFile*>(object);
}

}  // namespace

sqfs_file_t* make_descriptor_file(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return nullptr;
    auto* file = new (std::nothrow) DescriptorFile;
    if (file == nullptr) return nullptr;
    file->base.base.destroy = descriptor_destroy;
    file->base.base.copy = nullptr;
    file->base.read_at = descriptor_read_at;
    file->base.write_at = descriptor_write_at;
    file->base.get_size = descriptor_get_size;
    file->base.truncate = descriptor_truncate;
    file->fd = fd;
    file->size = static_cast<sqfs_u64>(st.st_size);
    return &file->base;
}

void free_library_memory(void* memory) {
    sqfs_free(memory);
}

void free_own_memory(void* memory) {
    std::free(memory);
}

InodePtr make_special_inode(unsigned int mode, const std::string& link_target,
                            sqfs_u32 device_number, sqfs_u32 links) {
    const size_t target_size = S_ISLNK(mode) ? link_target.size() : 0;
    // malloc-family memory: the inode ends in a flexible array member sized at run time.
    void* memory = std::calloc(1, sizeof(sqfs_inode_generic_t) + target_size);
    if (memory == nullptr) throw std::bad_alloc();
    InodePtr inode(static_cast<sqfs_inode_generic_t*>(memory), &free_own_memory);
    switch (mode & S_IFMT) {
        case S_IFLNK:
            inode->base.type = SQFS_INODE_SLINK;
            inode->data.slink.nlink = links;
            inode->data.slink.target_size = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_available = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_used = static_cast<sqfs_u32>(target_size);
            std::memcpy(inode->extra, link_target.data(), target_size);
            break;
        case S_IFCHR:
        case S_IFBLK:
            inode->base.type = S_ISCHR(mode) ? SQFS_INODE_CDEV : SQFS_INODE_BDEV;
            inode->data.dev.nlink = links;
            inode->data.dev.devno = device_number;
            break;
        case S_IFIFO:
        case S_IFSOCK:
            inode->base.type = S_ISFIFO(mode) ? SQFS_INODE_FIFO : SQFS_INODE_SOCKET;
            inode->data.ipc.nlink = links;
            break;
        default:
            return {nullptr, &free_own_memory};
    }
    return inode;
}

std::optional<sqfs_u32> squashfs_device_number(unsigned int major_number,
                                               unsigned int minor_number) {
    if (major_number > 0xfff || minor_number > 0xfffff) return std::nullopt;
    return (minor_number & 0xffU) | (major_number << 8) | ((minor_number & ~0xffU) << 12);
}

const char* describe_sqfs_error(int code) {
    switch (code) {
        case SQFS_ERROR_ALLOC:
            return "out of memory";
        case SQFS_ERROR_IO:
            return "input/output error";
        case SQFS_ERROR_COMPRESSOR:
            return "compressor failure";
        case SQFS_ERROR_INTERNAL:
            return "internal libsquashfs error";
        case SQFS_ERROR_UNSUPPORTED:
            return "unsupported by libsquashfs";
        case SQFS_ERROR_OVERFLOW:
            return "too large for squashfs";
        case SQFS_ERROR_OUT_OF_BOUNDS:
            return "out of bounds";
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

SquashfsWritePipeline::SquashfsWritePipeline(sqfs_file_t* image_file, SQFS_COMPRESSOR compressor_id,
                                             int compression_level, std::string message_context)
    : context(std::move(message_context)), file(image_file) {
    create_compressors(compressor_id, compression_level);
    reserve_superblock(compressor_id);
    create_table_writers();
    create_block_processor();
}

void SquashfsWritePipeline::create_compressors(SQFS_COMPRESSOR compressor_id,
                                               int compression_level) {
    const char* known_name = sqfs_compressor_name_from_id(compressor_id);
    const std::string name = known_name != nullptr ? known_name : "unknown";
    sqfs_compressor_config_t config{};
    check(sqfs_compressor_config_init(&config, compressor_id, kBlockSize, 0),
          "configuring the " + name + " compressor");
    if (compression_level != 0) config.level = static_cast<sqfs_u32>(compression_level);
    sqfs_compressor_t* created = nullptr;
    check(sqfs_compressor_create(&config, &created), "creating the " + name + " compressor");
    compressor.reset(created);
    config.flags |= SQFS_COMP_FLAG_UNCOMPRESS;
    created = nullptr;
    check(sqfs_compressor_create(&config, &created), "creating the " + name + " decompressor");
    decompressor.reset(created);
}

void SquashfsWritePipeline::reserve_superblock(SQFS_COMPRESSOR compressor_id) {
    check(sqfs_super_init(&super, kBlockSize, 0, compressor_id), "initializing the superblock");
    // A placeholder: the final superblock, written last, points at the tables that follow the data.
    check(sqfs_super_write(&super, file), "writing the superblock");
    int written = compressor->write_options(compressor.get(), file);
    if (written < 0) check(written, "writing the compressor options");
    if (written > 0) super.flags |= SQFS_FLAG_COMPRESSOR_OPTIONS;
}

void SquashfsWritePipeline::create_table_writers() {
    block_writer.reset(sqfs_block_writer_create(file, kDeviceBlockSize, 0));
    fragment_table.reset(sqfs_frag_table_create(0));
    id_table.reset(sqfs_id_table_create(0));
    inode_table.reset(sqfs_meta_writer_create(file, compressor.get(), 0));
    // The directory table goes after the inode table, so it is collected in memory meanwhile.
    directory_table.reset(
        sqfs_meta_writer_create(file, compressor.get(), SQFS_META_WRITER_KEEP_IN_MEMORY));
    if (!block_writer || !fragment_table || !id_table || !inode_table || !directory_table) {
        throw Error(context + ": out of memory creating the table writers");
    }
    directory_writer.reset(
        sqfs_dir_writer_create(directory_table.get(), SQFS_DIR_WRITER_CREATE_EXPORT_TABLE));
    if (!directory_writer) throw Error(context + ": out of memory creating the directory writer");
}

void SquashfsWritePipeline::create_block_processor() {
    unsigned int workers = worker_count();
    sqfs_block_processor_desc_t description{};
    description.size = sizeof description;
    description.max_block_size = kBlockSize;
    description.num_workers = workers;
    description.max_backlog = 10 * workers;  // gensquashfs's default: keeps every worker busy
    description.cmp = compressor.get();
    description.wr = block_writer.get();
    description.tbl = fragment_table.get();
    description.file = file;
    description.uncmp = decompressor.get();
    sqfs_block_processor_t* processor = nullptr;
    check(sqfs_block_processor_create_ex(&description, &processor),
          "creating the data block processor");
    block_processor.reset(processor);
}

InodePtr SquashfsWritePipeline::finish_directory_inode(sqfs_u32 parent_number,
                                                       sqfs_u32 subdirectories,
                                                       const std::string& what) {
    check(sqfs_dir_writer_end(directory_writer.get()), what);
    InodePtr inode(
        sqfs_dir_writer_create_inode(directory_writer.get(), 0, kNoXattrs, parent_number),
        &free_library_memory);
    if (!inode) throw Error(context + ": out of memory " + what);
    // The library counts every entry; POSIX counts "." and each subdirectory's "..".
    sqfs_u32 links = 2 + subdirectories;
    if (inode->base.type == SQFS_INODE_DIR) {
        inode->data.dir.nlink = links;
    } else {
        inode->data.dir_ext.nlink = links;
    }
    return inode;
}

sqfs_u64 SquashfsWritePipeline::write_inode(sqfs_inode_generic_t& inode, sqfs_u32 uid, sqfs_u32 gid,
                                            const std::string& what) {
    check(sqfs_id_table_id_to_index(id_table.get(), uid, &inode.base.uid_idx), what);
    check(sqfs_id_table_id_to_index(id_table.get(), gid, &inode.base.gid_idx), what);
    sqfs_u64 block = 0;
    sqfs_u32 offset = 0;
    sqfs_meta_writer_get_position(inode_table.get(), &block, &offset);
    check(sqfs_meta_writer_write_inode(inode_table.get(), &inode), what);
    return (block << 16) | offset;
}

void SquashfsWritePipeline::write_tables(sqfs_u32 root_number, sqfs_u64 root_ref,
                                         sqfs_xattr_writer_t* xattrs) {
    check(sqfs_meta_writer_flush(inode_table.get()), "writing the inode table");
    check(sqfs_meta_writer_flush(directory_table.get()), "writing the directory table");
    super.directory_table_start = file_size();
    check(sqfs_meta_write_write_to_file(directory_table.get()), "writing the directory table");
    check(sqfs_frag_table_write(fragment_table.get(), file, &super, compressor.get()),
          "writing the fragment table");
    check(sqfs_dir_writer_write_export_table(directory_writer.get(), file, compressor.get(),
                                             root_number, root_ref, &super),
          "writing the export table");
    check(sqfs_id_table_write(id_table.get(), file, &super, compressor.get()),
          "writing the ID table");
    if (xattrs != nullptr) {
        check(sqfs_xattr_writer_flush(xattrs, file, &super, compressor.get()),
              "writing the extended attribute table");
    }
    super.bytes_used = file_size();
    check(sqfs_super_write(&super, file), "writing the superblock");
    pad_to_device_block();
}

// Loop devices and block-based tools expect whole 4 KiB blocks; bytes_used excludes the padding.
void SquashfsWritePipeline::pad_to_device_block() {
    const sqfs_u64 size = file_size();
    const size_t remainder = size % kDeviceBlockSize;
    if (remainder == 0) return;
    std::vector<std::byte> zeros(kDeviceBlockSize - remainder);
    check(file->write_at(file, size, zeros.data(), zeros.size()), "padding the image");
}

sqfs_u64 SquashfsWritePipeline::file_size() const {
    return file->get_size(file);
}

void SquashfsWritePipeline::check(int result, const std::string& operation) const {
    if (result == 0) return;
    const int saved_errno = errno;
    std::string message = context + ": " + operation + ": " + describe_sqfs_error(result);
    // Only the I/O code comes from a failed system call whose errno is still meaningful.
    if (result == SQFS_ERROR_IO && saved_errno != 0) {
        message += std::string(" (") + std::strerror(saved_errno) + ")";
    }
    throw Error(message, result == SQFS_ERROR_IO ? saved_errno : 0);
}

}  // namespace sqbox

// The layout follows gensquashfs (squashfs-tools-ng): file data goes through the block processor
// while the tree is walked; once all data is out, inodes are written children before parents (a
// directory's entries need its children's inode positions), then the directory table, the
// fragment, export and ID tables, and finally the superblock that points at all of them.
#include "image/squashfs_writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

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

// Inodes come from libsquashfs (released with sqfs_free) or from here (released with free).
void free_library_memory(void* memory) {
    sqfs_free(memory);
}
void free_own_memory(void* memory) {
    std::free(memory);
}
using InodePtr = std::unique_ptr<sqfs_inode_generic_t, void (*)(void*)>;

struct DirCloser {
    // closedir() errors on a stream we own cannot be acted upon; the descriptor is gone either way.
    void operator()(DIR* dir) const { (void)::closedir(dir); }
};
using DirStream = std::unique_ptr<DIR, DirCloser>;

// One entry of the tree being packed.
struct Node {
    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    ~Node() { sqfs_free(file_inode); }

    [[nodiscard]] bool is_directory() const { return S_ISDIR(mode); }

    std::string name;
    sqfs_u16 mode = 0;  // file type and permission bits, as in st_mode
    sqfs_u32 uid = 0;
    sqfs_u32 gid = 0;
    sqfs_u32 mtime = 0;
    sqfs_u32 device_number = 0;   // char and block devices, in squashfs's encoding
    std::string link_target;      // symlinks
    std::vector<Node*> children;  // sorted by name: the kernel binary-searches directories
    // Regular files: allocated and completed by the block processor, which keeps the address of
    // this member until sqfs_block_processor_finish (Nodes never move, see ImageWriter::nodes_).
    sqfs_inode_generic_t* file_inode = nullptr;
    sqfs_u32 inode_number = 0;
    sqfs_u64 inode_ref = 0;  // position in the inode table, known once the inode is written
};

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

// squashfs stores unsigned 32-bit seconds.
sqfs_u32 squashfs_time(time_t seconds) {
    return static_cast<sqfs_u32>(
        std::clamp<time_t>(seconds, 0, std::numeric_limits<sqfs_u32>::max()));
}

// Threads the compressor may use: the CPUs this process may run on.
unsigned int worker_count() {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (::sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
    return static_cast<unsigned int>(std::max(1, CPU_COUNT(&cpus)));
}

// For messages only: the directory's path if /proc can tell it.
std::string describe_directory(int directory_fd) {
    std::string link = "/proc/self/fd/" + std::to_string(directory_fd);
    char target[4096];
    ssize_t length = ::readlink(link.c_str(), target, sizeof target);
    if (length <= 0 || static_cast<size_t>(length) == sizeof target) {
        return "directory fd " + std::to_string(directory_fd);
    }
    return {target, static_cast<size_t>(length)};
}

// The image file: created here (never over an existing file) and removed again unless the write
// completed.
class OutputFile {
  public:
    OutputFile(const std::string& path, const std::string& context) : path_(path) {
        file_.reset(sqfs_open_file(path.c_str(), 0));  // no OVERWRITE flag: O_CREAT | O_EXCL
        if (!file_) throw system_error(context + ": cannot create the image file");
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) throw system_error(context + ": cannot stat it");
        device_ = st.st_dev;
        inode_ = st.st_ino;
    }
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;
    ~OutputFile() {
        // Nobody is left to report a failed cleanup to; the write's own error is already thrown.
        if (!complete_) (void)::unlink(path_.c_str());
    }

    [[nodiscard]] sqfs_file_t* get() const { return file_.get(); }
    [[nodiscard]] sqfs_u64 size() const { return file_->get_size(file_.get()); }
    [[nodiscard]] bool is(const struct stat& st) const {
        return st.st_dev == device_ && st.st_ino == inode_;
    }
    void mark_complete() { complete_ = true; }

  private:
    std::string path_;
    SqfsObject<sqfs_file_t> file_;
    dev_t device_ = 0;
    ino_t inode_ = 0;
    bool complete_ = false;
};

class ImageWriter {
  public:
    ImageWriter(const std::string& output_path, const SquashfsWriteOptions& options,
                std::string source);
    void write(int directory_fd);
    [[nodiscard]] const SquashfsWriteSummary& summary() const { return summary_; }

  private:
    // Setup, in the order the objects depend on each other.
    void create_compressors();
    void reserve_superblock();
    void create_table_writers();
    void create_block_processor();

    // Walking the source tree; file data is packed on the way.
    Node& scan_directory(UniqueFd fd, const struct stat& st, const std::string& name,
                         const std::string& path);
    Node* scan_entry(int parent_fd, const std::string& name, const std::string& path);
    Node& scan_file(UniqueFd fd, const struct stat& st, const std::string& name,
                    const std::string& path);
    UniqueFd open_below(int parent_fd, const std::string& name, int flags, mode_t expected_type,
                        const std::string& path, struct stat& st) const;
    std::vector<std::string> list_directory(DIR* dir, bool top, const std::string& path) const;
    Node& add_node(const struct stat& st, const std::string& name);
    bool reference_has_same_setid_file(int fd, const struct stat& st,
                                       const std::string& path) const;
    std::string read_link_target(int parent_fd, const std::string& name, size_t size_hint,
                                 const std::string& path) const;
    sqfs_u32 device_number(dev_t device, const std::string& path) const;

    // Serializing the tree once all data is written.
    void number_inodes(Node& directory);
    void write_inodes_below(Node& directory);
    void write_inode(Node& node, sqfs_u32 parent_number);
    InodePtr make_directory_inode(const Node& directory, sqfs_u32 parent_number);
    InodePtr make_other_inode(const Node& node) const;
    void write_tables();
    void pad_to_device_block();

    void check(int result, const std::string& operation) const;
    [[nodiscard]] Error source_error(const std::string& operation, const std::string& path) const;
    [[nodiscard]] std::string source_path(const std::string& path) const;

    const SquashfsWriteOptions& options_;
    std::string context_;  // "writing squashfs image <path>", the start of every message
    std::string source_;   // the top directory, for messages
    OutputFile output_;
    SqfsObject<sqfs_compressor_t> compressor_;
    SqfsObject<sqfs_compressor_t> decompressor_;  // reads fragments back to deduplicate them
    sqfs_super_t super_{};
    SqfsObject<sqfs_block_writer_t> block_writer_;
    SqfsObject<sqfs_frag_table_t> fragment_table_;
    SqfsObject<sqfs_id_table_t> id_table_;
    SqfsObject<sqfs_meta_writer_t> inode_table_;
    SqfsObject<sqfs_meta_writer_t> directory_table_;
    SqfsObject<sqfs_dir_writer_t> directory_writer_;
    // Every node, owned here from its creation on and never moved (a deque does not relocate),
    // and declared before the block processor so that it outlives it: the processor holds
    // pointers into the file nodes.
    std::deque<Node> nodes_;
    Node* root_ = nullptr;
    SqfsObject<sqfs_block_processor_t> block_processor_;
    std::vector<std::byte> read_buffer_;
    sqfs_u32 inode_count_ = 0;
    SquashfsWriteSummary summary_;
};

ImageWriter::ImageWriter(const std::string& output_path, const SquashfsWriteOptions& options,
                         std::string source)
    : options_(options),
      context_("writing squashfs image " + output_path),
      source_(std::move(source)),
      output_(output_path, context_),
      read_buffer_(kBlockSize) {
    create_compressors();
    reserve_superblock();
    create_table_writers();
    create_block_processor();
}

void ImageWriter::create_compressors() {
    sqfs_compressor_config_t config{};
    check(sqfs_compressor_config_init(&config, SQFS_COMP_GZIP, kBlockSize, 0),
          "configuring the gzip compressor");
    sqfs_compressor_t* compressor = nullptr;
    check(sqfs_compressor_create(&config, &compressor), "creating the gzip compressor");
    compressor_.reset(compressor);
    config.flags |= SQFS_COMP_FLAG_UNCOMPRESS;
    sqfs_compressor_t* decompressor = nullptr;
    check(sqfs_compressor_create(&config, &decompressor), "creating the gzip decompressor");
    decompressor_.reset(decompressor);
}

void ImageWriter::reserve_superblock() {
    check(sqfs_super_init(&super_, kBlockSize, 0, SQFS_COMP_GZIP), "initializing the superblock");
    // A placeholder: the final superblock, written last, points at the tables that follow the data.
    check(sqfs_super_write(&super_, output_.get()), "writing the superblock");
    int written = compressor_->write_options(compressor_.get(), output_.get());
    if (written < 0) check(written, "writing the compressor options");
    if (written > 0) super_.flags |= SQFS_FLAG_COMPRESSOR_OPTIONS;
}

void ImageWriter::create_table_writers() {
    block_writer_.reset(sqfs_block_writer_create(output_.get(), kDeviceBlockSize, 0));
    fragment_table_.reset(sqfs_frag_table_create(0));
    id_table_.reset(sqfs_id_table_create(0));
    inode_table_.reset(sqfs_meta_writer_create(output_.get(), compressor_.get(), 0));
    // The directory table goes after the inode table, so it is collected in memory meanwhile.
    directory_table_.reset(
        sqfs_meta_writer_create(output_.get(), compressor_.get(), SQFS_META_WRITER_KEEP_IN_MEMORY));
    if (!block_writer_ || !fragment_table_ || !id_table_ || !inode_table_ || !directory_table_) {
        throw Error(context_ + ": out of memory creating the table writers");
    }
    directory_writer_.reset(
        sqfs_dir_writer_create(directory_table_.get(), SQFS_DIR_WRITER_CREATE_EXPORT_TABLE));
    if (!directory_writer_) throw Error(context_ + ": out of memory creating the directory writer");
}

void ImageWriter::create_block_processor() {
    unsigned int workers = worker_count();
    sqfs_block_processor_desc_t description{};
    description.size = sizeof description;
    description.max_block_size = kBlockSize;
    description.num_workers = workers;
    description.max_backlog = 10 * workers;  // gensquashfs's default: keeps every worker busy
    description.cmp = compressor_.get();
    description.wr = block_writer_.get();
    description.tbl = fragment_table_.get();
    description.file = output_.get();
    description.uncmp = decompressor_.get();
    sqfs_block_processor_t* processor = nullptr;
    check(sqfs_block_processor_create_ex(&description, &processor),
          "creating the data block processor");
    block_processor_.reset(processor);
}

void ImageWriter::write(int directory_fd) {
    UniqueFd top(::openat(directory_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!top) throw source_error("cannot open", "");
    struct stat st {};
    if (::fstat(top.get(), &st) != 0) throw source_error("cannot stat", "");
    root_ = &scan_directory(std::move(top), st, "", "");
    check(sqfs_block_processor_finish(block_processor_.get()), "writing the last data blocks");

    number_inodes(*root_);
    if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
        throw Error(context_ + ": too many files for squashfs");
    }
    root_->inode_number = ++inode_count_;
    super_.inode_count = inode_count_;
    super_.modification_time = root_->mtime;
    super_.inode_table_start = output_.size();
    write_inodes_below(*root_);
    // As mksquashfs does: the root's ".." points one past the last inode, never at inode 0.
    write_inode(*root_, inode_count_ + 1);
    super_.root_inode_ref = root_->inode_ref;
    write_tables();
    output_.mark_complete();
}

Node& ImageWriter::scan_directory(UniqueFd fd, const struct stat& st, const std::string& name,
                                  const std::string& path) {
    Node& node = add_node(st, name);
    DirStream dir(::fdopendir(fd.get()));
    if (!dir) throw source_error("cannot list", path);
    (void)fd.release();  // the stream owns the descriptor now
    for (const std::string& child : list_directory(dir.get(), path.empty(), path)) {
        std::string child_path = path.empty() ? child : path + "/" + child;
        Node* child_node = scan_entry(::dirfd(dir.get()), child, child_path);
        if (child_node != nullptr) node.children.push_back(child_node);
    }
    return node;
}

std::vector<std::string> ImageWriter::list_directory(DIR* dir, bool top,
                                                     const std::string& path) const {
    std::vector<std::string> names;
    for (;;) {
        errno = 0;
        const dirent* entry = ::readdir(dir);
        if (entry == nullptr) {
            if (errno != 0) throw source_error("cannot list", path);
            break;
        }
        std::string name = entry->d_name;
        if (name == "." || name == "..") continue;
        if (top && std::find(options_.exclude_top_level.begin(), options_.exclude_top_level.end(),
                             name) != options_.exclude_top_level.end()) {
            continue;
        }
        names.push_back(std::move(name));
    }
    // Byte order, as the kernel compares names (std::string compares as unsigned char).
    std::sort(names.begin(), names.end());
    return names;
}

// Returns null for an entry left out of the image.
Node* ImageWriter::scan_entry(int parent_fd, const std::string& name, const std::string& path) {
    struct stat st {};
    if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        throw source_error("cannot stat", path);
    }
    switch (st.st_mode & S_IFMT) {
        case S_IFDIR: {
            UniqueFd fd = open_below(parent_fd, name, O_DIRECTORY, S_IFDIR, path, st);
            return &scan_directory(std::move(fd), st, name, path);
        }
        case S_IFREG: {
            if (output_.is(st)) return nullptr;  // the image being written, inside its own tree
            // O_NONBLOCK: should a FIFO have taken the file's place, opening it must not hang.
            UniqueFd fd = open_below(parent_fd, name, O_NONBLOCK, S_IFREG, path, st);
            return &scan_file(std::move(fd), st, name, path);
        }
        case S_IFLNK: {
            Node& node = add_node(st, name);
            node.link_target =
                read_link_target(parent_fd, name, static_cast<size_t>(st.st_size), path);
            return &node;
        }
        case S_IFCHR:
        case S_IFBLK: {
            Node& node = add_node(st, name);
            node.device_number = device_number(st.st_rdev, path);
            return &node;
        }
        case S_IFIFO:
        case S_IFSOCK:
            return &add_node(st, name);
        default:
            throw Error(context_ + ": " + source_path(path) + " has an unknown file type");
    }
}

// Opens an entry without following symlinks and checks that it is still of the type the earlier
// lstat saw (it may have been replaced meanwhile); `st` is refreshed from the open file.
UniqueFd ImageWriter::open_below(int parent_fd, const std::string& name, int flags,
                                 mode_t expected_type, const std::string& path,
                                 struct stat& st) const {
    UniqueFd fd(
        ::openat(parent_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC | flags));
    if (!fd) throw source_error("cannot open", path);
    if (::fstat(fd.get(), &st) != 0) throw source_error("cannot stat", path);
    if ((st.st_mode & S_IFMT) != expected_type) {
        throw Error(context_ + ": " + source_path(path) + " changed type while being read");
    }
    return fd;
}

Node& ImageWriter::scan_file(UniqueFd fd, const struct stat& st, const std::string& name,
                             const std::string& path) {
    Node& node = add_node(st, name);
    constexpr sqfs_u16 kSetId = S_ISUID | S_ISGID;
    if (options_.setid_reference_fd >= 0 && (node.mode & kSetId) != 0 &&
        !reference_has_same_setid_file(fd.get(), st, path)) {
        node.mode = static_cast<sqfs_u16>(node.mode & ~kSetId);
        summary_.setid_dropped.push_back(path);
    }
    sqfs_block_processor_t* processor = block_processor_.get();
    check(sqfs_block_processor_begin_file(processor, &node.file_inode, nullptr, 0),
          "starting the data of " + source_path(path));
    for (;;) {
        ssize_t count = read_full(fd.get(), read_buffer_.data(), read_buffer_.size());
        if (count < 0) throw source_error("cannot read", path);
        if (count == 0) break;
        check(
            sqfs_block_processor_append(processor, read_buffer_.data(), static_cast<size_t>(count)),
            "packing the data of " + source_path(path));
        if (static_cast<size_t>(count) < read_buffer_.size()) break;  // end of file
    }
    check(sqfs_block_processor_end_file(processor), "finishing the data of " + source_path(path));
    return node;
}

// The reference tree's file at `path`, if it is a regular file with at least the setuid/setgid
// bits of `st` and the same bytes as `fd` (read with pread: the packing reads `fd` afterwards).
bool ImageWriter::reference_has_same_setid_file(int fd, const struct stat& st,
                                                const std::string& path) const {
    open_how how{};
    how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    UniqueFd reference(static_cast<int>(
        ::syscall(SYS_openat2, options_.setid_reference_fd, path.c_str(), &how, sizeof how)));
    if (!reference) return false;  // not in the reference (or not reachable the same way)
    struct stat ref {};
    if (::fstat(reference.get(), &ref) != 0 || !S_ISREG(ref.st_mode)) return false;
    const mode_t wanted = st.st_mode & (S_ISUID | S_ISGID);
    if ((ref.st_mode & wanted) != wanted || ref.st_size != st.st_size) return false;
    std::vector<char> ours(size_t{64} * 1024);
    std::vector<char> theirs(ours.size());
    for (off_t offset = 0; offset < st.st_size;) {
        const ssize_t count = ::pread(fd, ours.data(), ours.size(), offset);
        if (count < 0) throw source_error("cannot read", path);
        if (count == 0) return false;  // shorter than it was: changed while being read
        const ssize_t other = read_full(reference.get(), theirs.data(), static_cast<size_t>(count));
        if (other != count ||
            std::memcmp(ours.data(), theirs.data(), static_cast<size_t>(count)) != 0) {
            return false;
        }
        offset += count;
    }
    return true;
}

Node& ImageWriter::add_node(const struct stat& st, const std::string& name) {
    Node& node = nodes_.emplace_back();
    node.name = name;
    node.mode = static_cast<sqfs_u16>(st.st_mode & (S_IFMT | 07777));
    node.uid = options_.all_root ? 0 : st.st_uid;
    node.gid = options_.all_root ? 0 : st.st_gid;
    node.mtime = squashfs_time(st.st_mtim.tv_sec);
    return node;
}

std::string ImageWriter::read_link_target(int parent_fd, const std::string& name, size_t size_hint,
                                          const std::string& path) const {
    // st_size is the target's length for most filesystems; grow the buffer for the rest.
    std::string target(std::max<size_t>(size_hint, 64) + 1, '\0');
    for (;;) {
        ssize_t length = ::readlinkat(parent_fd, name.c_str(), target.data(), target.size());
        if (length < 0) throw source_error("cannot read the symlink", path);
        if (static_cast<size_t>(length) < target.size()) {
            target.resize(static_cast<size_t>(length));
            return target;
        }
        target.resize(target.size() * 2);
    }
}

// squashfs device numbers are read by the kernel's new_decode_dev(): minor bits 0-7 and 20-31,
// major bits 8-19.
sqfs_u32 ImageWriter::device_number(dev_t device, const std::string& path) const {
    unsigned int major_number = major(device);
    unsigned int minor_number = minor(device);
    if (major_number > 0xfff || minor_number > 0xfffff) {
        throw Error(context_ + ": " + source_path(path) + ": device number " +
                    std::to_string(major_number) + ":" + std::to_string(minor_number) +
                    " does not fit in squashfs");
    }
    return (minor_number & 0xffU) | (major_number << 8) | ((minor_number & ~0xffU) << 12);
}

// Numbers a directory's children consecutively (small deltas keep directory headers few),
// after everything below its subdirectories, so that every inode is numbered and later written
// before its parent, in number order.
void ImageWriter::number_inodes(Node& directory) {
    for (Node* child : directory.children) {
        if (child->is_directory()) number_inodes(*child);
    }
    for (Node* child : directory.children) {
        if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
            throw Error(context_ + ": too many files for squashfs");
        }
        child->inode_number = ++inode_count_;
    }
}

// The same traversal as number_inodes, so inodes are written in number order.
void ImageWriter::write_inodes_below(Node& directory) {
    for (Node* child : directory.children) {
        if (child->is_directory()) write_inodes_below(*child);
    }
    for (Node* child : directory.children) write_inode(*child, directory.inode_number);
}

void ImageWriter::write_inode(Node& node, sqfs_u32 parent_number) {
    InodePtr inode(nullptr, &free_library_memory);
    if (node.is_directory()) {
        inode = make_directory_inode(node, parent_number);
    } else if (S_ISREG(node.mode)) {
        inode = InodePtr(std::exchange(node.file_inode, nullptr), &free_library_memory);
    } else {
        inode = make_other_inode(node);
    }
    inode->base.mode = node.mode;
    inode->base.mod_time = node.mtime;
    inode->base.inode_number = node.inode_number;
    const std::string what = "writing the inode of " + (node.name.empty() ? "/" : node.name);
    check(sqfs_id_table_id_to_index(id_table_.get(), node.uid, &inode->base.uid_idx), what);
    check(sqfs_id_table_id_to_index(id_table_.get(), node.gid, &inode->base.gid_idx), what);
    sqfs_u64 block = 0;
    sqfs_u32 offset = 0;
    sqfs_meta_writer_get_position(inode_table_.get(), &block, &offset);
    node.inode_ref = (block << 16) | offset;
    check(sqfs_meta_writer_write_inode(inode_table_.get(), inode.get()), what);
}

InodePtr ImageWriter::make_directory_inode(const Node& directory, sqfs_u32 parent_number) {
    const std::string what = "writing directory " + (directory.name.empty() ? "/" : directory.name);
    sqfs_dir_writer_t* writer = directory_writer_.get();
    check(sqfs_dir_writer_begin(writer, 0), what);
    sqfs_u32 subdirectories = 0;
    for (const Node* child : directory.children) {
        check(sqfs_dir_writer_add_entry(writer, child->name.c_str(), child->inode_number,
                                        child->inode_ref, child->mode),
              what);
        if (child->is_directory()) ++subdirectories;
    }
    check(sqfs_dir_writer_end(writer), what);
    InodePtr inode(sqfs_dir_writer_create_inode(writer, 0, kNoXattrs, parent_number),
                   &free_library_memory);
    if (!inode) throw Error(context_ + ": out of memory " + what);
    // The library counts every entry; POSIX counts "." and each subdirectory's "..".
    sqfs_u32 links = 2 + subdirectories;
    if (inode->base.type == SQFS_INODE_DIR) {
        inode->data.dir.nlink = links;
    } else {
        inode->data.dir_ext.nlink = links;
    }
    return inode;
}

// Symlinks, devices, FIFOs and sockets.
InodePtr ImageWriter::make_other_inode(const Node& node) const {
    const size_t target_size = node.link_target.size();
    // malloc-family memory: the inode ends in a flexible array member sized at run time.
    void* memory = std::calloc(1, sizeof(sqfs_inode_generic_t) + target_size);
    if (memory == nullptr) throw std::bad_alloc();
    InodePtr inode(static_cast<sqfs_inode_generic_t*>(memory), &free_own_memory);
    switch (node.mode & S_IFMT) {
        case S_IFLNK:
            inode->base.type = SQFS_INODE_SLINK;
            inode->data.slink.nlink = 1;
            inode->data.slink.target_size = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_available = static_cast<sqfs_u32>(target_size);
            inode->payload_bytes_used = static_cast<sqfs_u32>(target_size);
            std::memcpy(inode->extra, node.link_target.data(), target_size);
            break;
        case S_IFCHR:
        case S_IFBLK:
            inode->base.type = S_ISCHR(node.mode) ? SQFS_INODE_CDEV : SQFS_INODE_BDEV;
            inode->data.dev.nlink = 1;
            inode->data.dev.devno = node.device_number;
            break;
        default:
            inode->base.type = S_ISFIFO(node.mode) ? SQFS_INODE_FIFO : SQFS_INODE_SOCKET;
            inode->data.ipc.nlink = 1;
            break;
    }
    return inode;
}

void ImageWriter::write_tables() {
    check(sqfs_meta_writer_flush(inode_table_.get()), "writing the inode table");
    check(sqfs_meta_writer_flush(directory_table_.get()), "writing the directory table");
    super_.directory_table_start = output_.size();
    check(sqfs_meta_write_write_to_file(directory_table_.get()), "writing the directory table");
    check(sqfs_frag_table_write(fragment_table_.get(), output_.get(), &super_, compressor_.get()),
          "writing the fragment table");
    check(sqfs_dir_writer_write_export_table(directory_writer_.get(), output_.get(),
                                             compressor_.get(), root_->inode_number,
                                             root_->inode_ref, &super_),
          "writing the export table");
    check(sqfs_id_table_write(id_table_.get(), output_.get(), &super_, compressor_.get()),
          "writing the ID table");
    super_.bytes_used = output_.size();
    check(sqfs_super_write(&super_, output_.get()), "writing the superblock");
    pad_to_device_block();
}

// Loop devices and block-based tools expect whole 4 KiB blocks; bytes_used excludes the padding.
void ImageWriter::pad_to_device_block() {
    const sqfs_u64 size = output_.size();
    const size_t remainder = size % kDeviceBlockSize;
    if (remainder == 0) return;
    std::vector<std::byte> zeros(kDeviceBlockSize - remainder);
    check(output_.get()->write_at(output_.get(), size, zeros.data(), zeros.size()),
          "padding the image");
}

void ImageWriter::check(int result, const std::string& operation) const {
    if (result == 0) return;
    const int saved_errno = errno;
    std::string message = context_ + ": " + operation + ": " + describe_sqfs_error(result);
    // Only the I/O code comes from a failed system call whose errno is still meaningful.
    if (result == SQFS_ERROR_IO && saved_errno != 0) {
        message += std::string(" (") + std::strerror(saved_errno) + ")";
    }
    throw Error(message, result == SQFS_ERROR_IO ? saved_errno : 0);
}

Error ImageWriter::source_error(const std::string& operation, const std::string& path) const {
    const int saved_errno = errno;  // before building the message allocates
    return system_error(context_ + ": " + operation + " " + source_path(path), saved_errno);
}

std::string ImageWriter::source_path(const std::string& path) const {
    return path.empty() ? source_ : source_ + "/" + path;
}

}  // namespace

SquashfsWriteSummary write_squashfs_image(int directory_fd, const std::string& output_path,
                                          const SquashfsWriteOptions& options) {
    ImageWriter writer(output_path, options, describe_directory(directory_fd));
    writer.write(directory_fd);
    return writer.summary();
}

}  // namespace sqbox

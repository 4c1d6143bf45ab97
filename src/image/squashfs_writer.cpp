// The layout follows gensquashfs (squashfs-tools-ng): file data goes through the block processor
// while the tree is walked; once all data is out, inodes are written children before parents (a
// directory's entries need its children's inode positions), then the directory table, the
// fragment, export and ID tables, and finally the superblock that points at all of them.
#include "image/squashfs_writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sqfs/block_processor.h>
#include <sqfs/dir_writer.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "image/libsquashfs_support.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

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
    static InodePtr make_other_inode(const Node& node);

    void check(int result, const std::string& operation) const;
    [[nodiscard]] Error source_error(const std::string& operation, const std::string& path) const;
    [[nodiscard]] std::string source_path(const std::string& path) const;

    const SquashfsWriteOptions& options_;
    std::string context_;  // "writing squashfs image <path>", the start of every message
    std::string source_;   // the top directory, for messages
    OutputFile output_;
    // Every node, owned here from its creation on and never moved (a deque does not relocate),
    // and declared before the pipeline so that it outlives the block processor, which holds
    // pointers into the file nodes.
    std::deque<Node> nodes_;
    Node* root_ = nullptr;
    SquashfsWritePipeline pipeline_;
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
      pipeline_(output_.get(), SQFS_COMP_GZIP, 0, context_),
      read_buffer_(kBlockSize) {}

void ImageWriter::write(int directory_fd) {
    UniqueFd top(::openat(directory_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!top) throw source_error("cannot open", "");
    struct stat st {};
    if (::fstat(top.get(), &st) != 0) throw source_error("cannot stat", "");
    root_ = &scan_directory(std::move(top), st, "", "");
    check(sqfs_block_processor_finish(pipeline_.block_processor.get()),
          "writing the last data blocks");

    number_inodes(*root_);
    if (inode_count_ == std::numeric_limits<sqfs_u32>::max()) {
        throw Error(context_ + ": too many files for squashfs");
    }
    root_->inode_number = ++inode_count_;
    pipeline_.super.inode_count = inode_count_;
    pipeline_.super.modification_time = root_->mtime;
    pipeline_.super.inode_table_start = output_.size();
    write_inodes_below(*root_);
    // As mksquashfs does: the root's ".." points one past the last inode, never at inode 0.
    write_inode(*root_, inode_count_ + 1);
    pipeline_.super.root_inode_ref = root_->inode_ref;
    pipeline_.write_tables(root_->inode_number, root_->inode_ref, nullptr);
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
    sqfs_block_processor_t* processor = pipeline_.block_processor.get();
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

sqfs_u32 ImageWriter::device_number(dev_t device, const std::string& path) const {
    unsigned int major_number = major(device);
    unsigned int minor_number = minor(device);
    const std::optional<sqfs_u32> encoded = squashfs_device_number(major_number, minor_number);
    if (!encoded) {
        throw Error(context_ + ": " + source_path(path) + ": device number " +
                    std::to_string(major_number) + ":" + std::to_string(minor_number) +
                    " does not fit in squashfs");
    }
    return *encoded;
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
    node.inode_ref = pipeline_.write_inode(*inode, node.uid, node.gid, what);
}

InodePtr ImageWriter::make_directory_inode(const Node& directory, sqfs_u32 parent_number) {
    const std::string what = "writing directory " + (directory.name.empty() ? "/" : directory.name);
    sqfs_dir_writer_t* writer = pipeline_.directory_writer.get();
    check(sqfs_dir_writer_begin(writer, 0), what);
    sqfs_u32 subdirectories = 0;
    for (const Node* child : directory.children) {
        check(sqfs_dir_writer_add_entry(writer, child->name.c_str(), child->inode_number,
                                        child->inode_ref, child->mode),
              what);
        if (child->is_directory()) ++subdirectories;
    }
    return pipeline_.finish_directory_inode(parent_number, subdirectories, what);
}

// Symlinks, devices, FIFOs and sockets.
InodePtr ImageWriter::make_other_inode(const Node& node) {
    InodePtr inode = make_special_inode(node.mode, node.link_target, node.device_number, 1);
    // scan_entry already refused every other type.
    if (!inode) throw Error("unexpected file type of " + (node.name.empty() ? "/" : node.name));
    return inode;
}

void ImageWriter::check(int result, const std::string& operation) const {
    pipeline_.check(result, operation);
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

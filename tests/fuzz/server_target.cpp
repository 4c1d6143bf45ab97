// The image server driven without a kernel: libfuse gets FUSE requests made here, as the kernel
// would send them, and writes its replies to a memory file, where they are read back to walk the
// tree further. A file, not a socket or a pipe: a spliced reply's header lives on libfuse's stack
// and a socket would keep a reference to that page instead of a copy of it.
#include <linux/fuse.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_targets.h"
#include "image/squashfs_extents.h"
#include "image/squashfs_guards.h"
#include "image/squashfs_server.h"
#include "util/unique_fd.h"

namespace sqbox::fuzz {
namespace {

// Bounds on one input's work, so that an image claiming huge files or directories stays fast.
constexpr size_t kMaxRequests = 1500;
constexpr size_t kMaxNodes = 200;
constexpr uint32_t kReadSize = 48 << 10;
constexpr uint64_t kMaxReadPerFile = uint64_t{160} << 10;
constexpr uint32_t kReaddirSize = 1024;  // small, so that listings take several requests
constexpr int kMaxReaddirPages = 32;

struct Reply {
    int32_t error = 0;
    std::vector<char> payload;
};

// One server session with the kernel's end of its connection played here.
class FuseClient {
  public:
    FuseClient(sqfs_ll* image, const SquashfsServerOptions& options) {
        replies_ = ::memfd_create("sqbox-fuzz-replies", MFD_CLOEXEC);
        if (replies_ < 0) std::abort();
        session_ = new_squashfs_session(image, options);
        if (session_ == nullptr) std::abort();
        const std::string device = "/dev/fd/" + std::to_string(replies_);
        if (fuse_session_mount(session_, device.c_str()) != 0) std::abort();
    }
    ~FuseClient() {
        fuse_session_destroy(session_);  // closes replies_
    }
    FuseClient(const FuseClient&) = delete;
    FuseClient& operator=(const FuseClient&) = delete;

    [[nodiscard]] bool budget_left() const { return requests_ < kMaxRequests; }

    // Sends one request; its reply, or nullopt for none (forget has none).
    std::optional<Reply> send(uint32_t opcode, uint64_t nodeid, const void* argument,
                              size_t argument_size, const std::string* name = nullptr) {
        ++requests_;
        fuse_in_header header{};
        const size_t name_size = name != nullptr ? name->size() + 1 : 0;
        header.len = static_cast<uint32_t>(sizeof header + argument_size + name_size);
        header.opcode = opcode;
        header.unique = ++unique_;
        header.nodeid = nodeid;
        std::vector<char> message(header.len);
        std::memcpy(message.data(), &header, sizeof header);
        if (argument_size > 0) std::memcpy(message.data() + sizeof header, argument, argument_size);
        if (name != nullptr) {
            std::memcpy(message.data() + sizeof header + argument_size, name->c_str(), name_size);
        }
        fuse_buf buffer{};
        buffer.size = message.size();
        buffer.mem = message.data();
        fuse_session_process_buf(session_, &buffer);
        if (opcode == FUSE_FORGET) return std::nullopt;
        return receive();
    }

  private:
    // libfuse wrote the whole reply before process_buf returned; the file is emptied for the
    // next one.
    Reply receive() {
        fuse_out_header header{};
        read_exactly(&header, sizeof header, 0);
        if (header.len < sizeof header || header.unique != unique_) std::abort();
        Reply reply;
        reply.error = header.error;
        reply.payload.resize(header.len - sizeof header);
        read_exactly(reply.payload.data(), reply.payload.size(), sizeof header);
        if (::lseek(replies_, 0, SEEK_END) != static_cast<off_t>(header.len) ||
            ::ftruncate(replies_, 0) != 0 || ::lseek(replies_, 0, SEEK_SET) != 0) {
            std::abort();  // more than one reply, or none
        }
        return reply;
    }

    void read_exactly(void* data, size_t size, off_t offset) const {
        // A request that got no reply reads short.
        if (::pread(replies_, data, size, offset) != static_cast<ssize_t>(size)) std::abort();
    }

    fuse_session* session_ = nullptr;
    int replies_ = -1;  // the session's "device", closed by fuse_session_destroy
    uint64_t unique_ = 0;
    size_t requests_ = 0;
};

template <typename T>
T payload_as(const Reply& reply) {
    T value{};
    if (reply.error != 0 || reply.payload.size() < sizeof value) return value;
    std::memcpy(&value, reply.payload.data(), sizeof value);
    return value;
}

void initialize(FuseClient& client, bool splice) {
    fuse_init_in init{};
    init.major = FUSE_KERNEL_VERSION;
    init.minor = 31;
    init.max_readahead = 128 << 10;
    init.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_CACHE_SYMLINKS | FUSE_DO_READDIRPLUS;
    if (splice) init.flags |= FUSE_SPLICE_WRITE | FUSE_SPLICE_MOVE;
    (void)client.send(FUSE_INIT, 0, &init, sizeof init);
}

void read_file(FuseClient& client, uint64_t node, uint64_t size) {
    const uint64_t end = std::min(size, kMaxReadPerFile);
    // Aligned reads as the kernel's page cache makes them, one unaligned, and one past the end.
    for (uint64_t offset = 0; offset < end && client.budget_left(); offset += kReadSize) {
        fuse_read_in read{};
        read.offset = offset;
        read.size = kReadSize;
        (void)client.send(FUSE_READ, node, &read, sizeof read);
    }
    fuse_read_in odd{};
    odd.offset = size / 3 + 1;
    odd.size = 4097;
    (void)client.send(FUSE_READ, node, &odd, sizeof odd);
    odd.offset = size + 5;
    (void)client.send(FUSE_READ, node, &odd, sizeof odd);
}

// The names of the directory `node`, page by page as the kernel lists it.
std::vector<std::string> list_directory(FuseClient& client, uint64_t node) {
    std::vector<std::string> names;
    uint64_t offset = 0;
    for (int page = 0; page < kMaxReaddirPages && client.budget_left(); ++page) {
        fuse_read_in read{};
        read.offset = offset;
        read.size = kReaddirSize;
        std::optional<Reply> reply = client.send(FUSE_READDIR, node, &read, sizeof read);
        if (!reply || reply->error != 0 || reply->payload.empty()) break;
        size_t at = 0;
        uint64_t next = offset;
        while (at + FUSE_NAME_OFFSET <= reply->payload.size()) {
            fuse_dirent entry{};
            std::memcpy(&entry, reply->payload.data() + at, FUSE_NAME_OFFSET);
            if (at + FUSE_NAME_OFFSET + entry.namelen > reply->payload.size()) std::abort();
            names.emplace_back(reply->payload.data() + at + FUSE_NAME_OFFSET, entry.namelen);
            next = entry.off;
            at += FUSE_DIRENT_SIZE(&entry);
        }
        if (next <= offset) break;  // an image whose offsets do not advance
        offset = next;
    }
    return names;
}

void walk(FuseClient& client) {
    fuse_getattr_in getattr{};
    (void)client.send(FUSE_GETATTR, FUSE_ROOT_ID, &getattr, sizeof getattr);
    (void)client.send(FUSE_STATFS, FUSE_ROOT_ID, nullptr, 0);
    std::vector<uint64_t> directories = {FUSE_ROOT_ID};
    std::unordered_set<uint64_t> seen = {FUSE_ROOT_ID};
    std::vector<uint64_t> looked_up;
    while (!directories.empty() && client.budget_left()) {
        const uint64_t directory = directories.back();
        directories.pop_back();
        std::vector<std::string> names = list_directory(client, directory);
        names.emplace_back("no-such-name");
        for (const std::string& name : names) {
            if (!client.budget_left() || seen.size() >= kMaxNodes) break;
            std::optional<Reply> reply = client.send(FUSE_LOOKUP, directory, nullptr, 0, &name);
            const auto entry = payload_as<fuse_entry_out>(*reply);
            if (entry.nodeid == 0) continue;
            looked_up.push_back(entry.nodeid);
            if (!seen.insert(entry.nodeid).second) continue;
            (void)client.send(FUSE_GETATTR, entry.nodeid, &getattr, sizeof getattr);
            const uint32_t mode = entry.attr.mode;
            if (S_ISDIR(mode)) {
                directories.push_back(entry.nodeid);
            } else if (S_ISREG(mode)) {
                read_file(client, entry.nodeid, entry.attr.size);
            } else if (S_ISLNK(mode)) {
                (void)client.send(FUSE_READLINK, entry.nodeid, nullptr, 0);
            }
        }
    }
    // Requests the kernel can send for any inode number, the server's answers being refusals.
    fuse_read_in read{};
    read.size = kReadSize;
    (void)client.send(FUSE_READDIR, FUSE_ROOT_ID + 1, &read, sizeof read);
    (void)client.send(FUSE_READ, FUSE_ROOT_ID, &read, sizeof read);
    fuse_open_in open{};
    (void)client.send(FUSE_OPEN, FUSE_ROOT_ID, &open, sizeof open);
    fuse_getxattr_in getxattr{};
    getxattr.size = 256;
    const std::string xattr = "user.overlay.opaque";
    (void)client.send(FUSE_GETXATTR, FUSE_ROOT_ID, &getxattr, sizeof getxattr, &xattr);
    (void)client.send(FUSE_LISTXATTR, FUSE_ROOT_ID, &getxattr, sizeof getxattr);
    for (const uint64_t node : looked_up) {
        fuse_forget_in forget{};
        forget.nlookup = 1;
        (void)client.send(FUSE_FORGET, node, &forget, sizeof forget);
    }
}

// Where find_stored_extents says a file's bytes lie verbatim, they must be the bytes
// libsquashfuse reads for it.
void check_extents(sqfs* fs, sqfs_inode& inode) {
    if (!S_ISREG(inode.base.mode)) return;
    const uint64_t length = std::min<uint64_t>(inode.xtra.reg.file_size, kMaxReadPerFile);
    for (const uint64_t offset : {uint64_t{0}, length / 2}) {
        std::vector<ImageExtent> extents;
        if (!find_stored_extents(fs, &inode, offset, length - offset, extents)) continue;
        std::vector<char> stored;
        for (const ImageExtent& extent : extents) {
            const size_t at = stored.size();
            stored.resize(at + extent.length);
            if (::pread(fs->fd, stored.data() + at, extent.length,
                        static_cast<off_t>(extent.image_offset)) !=
                static_cast<ssize_t>(extent.length)) {
                std::abort();  // the extents name bytes outside the image
            }
        }
        std::vector<char> read(length - offset);
        auto got = static_cast<sqfs_off_t>(read.size());
        if (checked_read_range(fs, &inode, static_cast<sqfs_off_t>(offset), &got, read.data()) !=
            SQFS_OK) {
            continue;
        }
        read.resize(static_cast<size_t>(got));
        if (read != stored) std::abort();
    }
}

}  // namespace

void image_server(const uint8_t* data, size_t size) {
    std::optional<ImageSource> image = open_fuzz_image(data, size);
    if (!image) return;
    SquashfsServerOptions options;
    options.owner_uid = 1000;
    options.owner_gid = 1000;
    // An empty directory: the prefetch thread finds nothing there, but it is handed every job.
    options.mount_point = scratch_directory();
    for (const bool splice : {true, false}) {
        FuseClient client(image->squashfs.get(), options);
        initialize(client, splice);
        walk(client);
        options.mount_point.clear();
    }
    sqfs* fs = &image->squashfs->fs;
    walk_image(fs, kMaxNodes,
               [&](const std::string&, sqfs_inode& inode) { check_extents(fs, inode); });
}

}  // namespace sqbox::fuzz

#include "image/squashfs_server.h"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_set>
#include <vector>

#include <malloc.h>

#include "image/image_names.h"
#include "image/squashfs_extents.h"
#include "image/squashfs_guards.h"
#include "image/squashfs_prefetch.h"
#include "image/squashfuse_api.h"
#include "util/files.h"

namespace sqbox {
namespace {

// The image never changes while it is mounted, so the kernel may cache names and attributes
// forever (libsquashfuse's own choice too).
constexpr double kCacheForever = DBL_MAX;

SquashfsServerOptions g_options;
// Paths of the inodes handed out, for the prefetcher.
ImageNames g_names;
std::optional<SquashfsPrefetcher> g_prefetcher_storage;
// Null without a mount point, or when its thread could not start: reads still work.
SquashfsPrefetcher* g_prefetcher = nullptr;

// The inode numbers handed to the kernel are the image's inode references, moved clear of 0 and
// FUSE_ROOT_ID: a number says which inode it stands for without a table, so a server started
// again on the same connection (sqbox serve, after a crash) answers for every number the kernel
// already holds. Not the library's numbering, which reads the export table with numbers the
// image chose (image/squashfs_guards.h); each inode is checked when it is read, like any other.
constexpr fuse_ino_t kInodeNumberBase = 2;

fuse_ino_t inode_number_of(sqfs_inode_id id) {
    return static_cast<fuse_ino_t>(id) + kInodeNumberBase;
}

// Inodes already checked: the image does not change, so checked_inode_get's walk (the inode,
// its directory index, its fragment entry) is done once per inode, not on every request.
std::unordered_set<sqfs_inode_id> g_checked_inodes;

sqfs_err get_checked_inode(sqfs* fs, sqfs_inode* inode, sqfs_inode_id id) {
    if (g_checked_inodes.contains(id)) return sqfs_inode_get(fs, inode, id);
    const sqfs_err err = checked_inode_get(fs, inode, id);
    if (err == SQFS_OK) g_checked_inodes.insert(id);
    return err;
}

// The checked inode `ino` stands for, or false once the request is answered with an error.
bool find_inode(fuse_req_t req, fuse_ino_t ino, sqfs_ll** ll, sqfs_inode* inode) {
    *ll = static_cast<sqfs_ll*>(fuse_req_userdata(req));
    sqfs_inode_id id = 0;
    if (ino == FUSE_ROOT_ID) {
        id = sqfs_inode_root(&(*ll)->fs);
    } else {
        if (ino < kInodeNumberBase) {
            fuse_reply_err(req, ENOENT);
            return false;
        }
        id = static_cast<sqfs_inode_id>(ino - kInodeNumberBase);
    }
    if (get_checked_inode(&(*ll)->fs, inode, id) != SQFS_OK) {
        fuse_reply_err(req, EIO);
        return false;
    }
    return true;
}

// The kernel takes spliced replies (decided in op_init).
bool g_splice = false;

// Measured on a 2-vCPU VM: 50 us takes ~20% off a cold `python3 -c pass`; longer buys nothing.
constexpr long kSpinMicroseconds = 50;

void apply_owner(struct stat* st) {
    st->st_uid = g_options.owner_uid;
    st->st_gid = g_options.owner_gid;
}

// getattr and lookup are libsquashfuse's, except that ownership is rewritten (see header).
void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* /*fi*/) {
    sqfs_ll* ll = nullptr;
    sqfs_inode inode;
    if (!find_inode(req, ino, &ll, &inode)) return;
    struct stat st {};
    if (sqfs_stat(&ll->fs, &inode, &st) != SQFS_OK) {
        fuse_reply_err(req, EIO);
        return;
    }
    st.st_ino = ino;
    apply_owner(&st);
    fuse_reply_attr(req, &st, kCacheForever);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    sqfs_ll* ll = nullptr;
    sqfs_inode directory;
    if (!find_inode(req, parent, &ll, &directory)) return;
    if (!S_ISDIR(directory.base.mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    DirEntryBuffer entry;
    bool found = false;
    if (sqfs_dir_lookup(&ll->fs, &directory, name, std::strlen(name), entry.get(), &found) !=
            SQFS_OK ||
        !entry.name_ok()) {
        fuse_reply_err(req, EIO);
        return;
    }
    if (!found) {
        // A negative entry (inode 0) with a timeout lets the kernel remember that the name does
        // not exist, instead of asking again on every lookup.
        fuse_entry_param negative{};
        negative.entry_timeout = kCacheForever;
        fuse_reply_entry(req, &negative);
        return;
    }
    sqfs_inode inode;
    fuse_entry_param reply{};
    if (get_checked_inode(&ll->fs, &inode, sqfs_dentry_inode(entry.get())) != SQFS_OK ||
        sqfs_stat(&ll->fs, &inode, &reply.attr) != SQFS_OK) {
        fuse_reply_err(req, EIO);
        return;
    }
    reply.attr_timeout = kCacheForever;
    reply.entry_timeout = kCacheForever;
    reply.ino = inode_number_of(sqfs_dentry_inode(entry.get()));
    reply.attr.st_ino = static_cast<ino_t>(reply.ino);
    apply_owner(&reply.attr);
    fuse_reply_entry(req, &reply);
    g_names.add(parent, name, reply.ino);
}

// Every FUSE request is a round trip through this process, so the server answers opendir with
// ENOSYS: the kernel then stops sending opendir/releasedir pairs and keeps directory contents
// cached (FOPEN_CACHE_DIR). readdir therefore finds the inode from its number on each call.
void op_unsupported(fuse_req_t req, fuse_ino_t /*ino*/, struct fuse_file_info* /*fi*/) {
    fuse_reply_err(req, ENOSYS);
}

// FileOpens::kAnswered: files are opened for real, to say FOPEN_NOFLUSH: without it every close of
// a file of the image sends FLUSH and waits for the answer (until the first ENOSYS tells the kernel
// to stop), and a close that waits once this server has died never ends: the server's own
// read-ahead thread closes files of this mount, and when the process is killed its last thread
// closes them while exiting, holding the very connection that would have to answer (seen as
// sandboxes that never end once init failed early). The contents stay cached (FOPEN_KEEP_CACHE);
// read finds the inode from its number, as before.
void op_open(fuse_req_t req, fuse_ino_t /*ino*/, struct fuse_file_info* fi) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
        fuse_reply_err(req, EROFS);
        return;
    }
    fi->keep_cache = 1;
    fi->noflush = 1;
    fuse_reply_open(req, fi);
}

// FileOpens::kWithoutMessages: the kernel takes ENOSYS to mean "open without asking" and asks no
// more (keeping contents cached, as FOPEN_KEEP_CACHE would). FLUSH, having no handler, is refused
// with ENOSYS too, which ends FLUSH for the connection (see FileOpens). The mount is read-only,
// so no open for writing comes here; one that did would be refused and ask again next time.
void op_open_without_messages(fuse_req_t req, fuse_ino_t /*ino*/, struct fuse_file_info* fi) {
    fuse_reply_err(req, (fi->flags & O_ACCMODE) != O_RDONLY ? EROFS : ENOSYS);
}

// Extended attributes are not exposed: overlayfs would otherwise ask for its own user.overlay.*
// attributes on every lookup (and an image could plant them), and capabilities stored in them mean
// nothing in a sandbox without privileges.
void op_no_getxattr(fuse_req_t req, fuse_ino_t /*ino*/, const char* /*name*/, size_t /*size*/) {
    fuse_reply_err(req, ENOSYS);
}
void op_no_listxattr(fuse_req_t req, fuse_ino_t /*ino*/, size_t /*size*/) {
    fuse_reply_err(req, ENOSYS);
}

// One reply buffer reused for every read: malloc of a request-sized block would map and fault in
// fresh pages each time.
std::vector<char>& read_buffer() {
    static std::vector<char> buffer;
    return buffer;
}

// Answers a read from stored data blocks by splicing the image's own pages to the kernel: no
// copy through this process. False if the range is not all stored blocks or splicing is off.
bool reply_from_stored_blocks(fuse_req_t req, sqfs* fs, sqfs_inode* inode, uint64_t offset,
                              uint64_t length) {
    static std::vector<ImageExtent> extents;
    static std::vector<char> storage;
    if (!g_splice || !find_stored_extents(fs, inode, offset, length, extents)) return false;
    // libfuse falls back to reading into memory itself if splicing fails.
    (void)fuse_reply_data(req, image_extents_bufvec(fs->fd, extents, storage),
                          static_cast<fuse_buf_copy_flags>(0));
    return true;
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
             struct fuse_file_info* /*fi*/) {
    sqfs_ll* ll = nullptr;
    sqfs_inode inode;
    if (!find_inode(req, ino, &ll, &inode)) return;
    if (!S_ISREG(inode.base.mode)) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    const auto start = static_cast<uint64_t>(offset);
    const uint64_t file_size = inode.xtra.reg.file_size;
    const uint64_t wanted = start < file_size ? std::min<uint64_t>(size, file_size - start) : 0;
    if (!reply_from_stored_blocks(req, &ll->fs, &inode, start, wanted)) {
        std::vector<char>& buffer = read_buffer();
        if (buffer.size() < size) buffer.resize(size);
        sqfs_off_t length = static_cast<sqfs_off_t>(size);
        // A reply shorter than the file's bytes asked for would be the end of the file to the
        // kernel (it would shrink the file there): a block that fails to decode is EIO instead.
        if (checked_read_range(&ll->fs, &inode, offset, &length, buffer.data()) != SQFS_OK ||
            static_cast<uint64_t>(length) < wanted) {
            fuse_reply_err(req, EIO);
            return;
        }
        fuse_reply_buf(req, buffer.data(), static_cast<size_t>(length));
    }
    if (g_prefetcher != nullptr) g_prefetcher->file_read(ino, file_size, start + wanted);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
                struct fuse_file_info* /*fi*/) {
    sqfs_ll* ll = nullptr;
    sqfs_inode inode;
    if (!find_inode(req, ino, &ll, &inode)) return;
    if (!S_ISDIR(inode.base.mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    sqfs_dir dir;
    if (sqfs_dir_open(&ll->fs, &inode, &dir, offset) != SQFS_OK) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    std::vector<char>& buffer = read_buffer();
    if (buffer.size() < size) buffer.resize(size);
    DirEntryBuffer entry;
    size_t used = 0;
    sqfs_err err = SQFS_OK;
    while (sqfs_dir_next(&ll->fs, &dir, entry.get(), &err)) {
        if (!entry.name_ok()) {
            err = SQFS_ERR;
            break;
        }
        struct stat st {};
        st.st_ino = static_cast<ino_t>(inode_number_of(sqfs_dentry_inode(entry.get())));
        st.st_mode = sqfs_dentry_mode(entry.get());
        size_t needed =
            fuse_add_direntry(req, buffer.data() + used, size - used, sqfs_dentry_name(entry.get()),
                              &st, static_cast<off_t>(sqfs_dentry_next_offset(entry.get())));
        if (needed > size - used) break;
        used += needed;
    }
    if (err != SQFS_OK) {
        fuse_reply_err(req, EIO);
        return;
    }
    fuse_reply_buf(req, buffer.data(), used);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
    sqfs_ll* ll = nullptr;
    sqfs_inode inode;
    if (!find_inode(req, ino, &ll, &inode)) return;
    if (!S_ISLNK(inode.base.mode)) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    // The target's length was bounded by checked_inode_get.
    char target[4096 + 1];
    size_t size = sizeof target;
    if (sqfs_readlink(&ll->fs, &inode, target, &size) != SQFS_OK) {
        fuse_reply_err(req, EIO);
        return;
    }
    fuse_reply_readlink(req, target);
}

// Symlinks never change either: let the kernel keep their targets in its page cache instead of
// asking for each one every time a path crosses it (/lib, /bin, /usr/bin/python3, ...).
void op_init(void* /*userdata*/, fuse_conn_info* connection) {
    if ((connection->capable & FUSE_CAP_CACHE_SYMLINKS) != 0) {
        connection->want |= FUSE_CAP_CACHE_SYMLINKS;
    }
    // Splicing replies lets stored data blocks go from the image's page cache to the kernel's
    // FUSE pages without passing through this process.
    if ((connection->capable & FUSE_CAP_SPLICE_WRITE) != 0) {
        connection->want |= FUSE_CAP_SPLICE_WRITE;
        g_splice = true;
    }
}

fuse_lowlevel_ops make_operations(FileOpens file_opens) {
    fuse_lowlevel_ops ops{};
    ops.init = op_init;
    ops.lookup = op_lookup;
    ops.getattr = op_getattr;
    ops.forget = sqfs_ll_op_forget;
    ops.open = file_opens == FileOpens::kWithoutMessages ? op_open_without_messages : op_open;
    ops.opendir = op_unsupported;
    ops.read = op_read;
    ops.readdir = op_readdir;
    ops.readlink = op_readlink;
    ops.getxattr = op_no_getxattr;
    ops.listxattr = op_no_listxattr;
    ops.statfs = stfs_ll_op_statfs;
    return ops;
}

// Requests come in bursts (a process starting up faults in its binary and libraries one read at a
// time). Sleeping between them costs a cross-CPU wake-up per request, which dominates on VMs, so
// the loop polls the device without blocking for a short while before it sleeps.
// The start of every request the kernel sends (struct fuse_in_header).
struct RequestHeader {
    uint32_t length;
    uint32_t opcode;
    uint64_t unique;
};
constexpr uint32_t kFuseInit = 26;  // FUSE_INIT
// A request id the kernel never hands out (ids are even, counting up from 2): the answer to a
// replayed INIT goes nowhere.
constexpr uint64_t kReplayedUnique = ~uint64_t{1};

void note_request(ServerRecord* record, const fuse_buf& buffer, int size) {
    if (record == nullptr || (buffer.flags & FUSE_BUF_IS_FD) != 0 ||
        static_cast<size_t>(size) < sizeof(RequestHeader)) {
        return;
    }
    RequestHeader header;
    std::memcpy(&header, buffer.mem, sizeof header);
    record->request_unique = header.unique;
    if (header.opcode == kFuseInit && static_cast<size_t>(size) <= sizeof record->init) {
        std::memcpy(record->init, buffer.mem, static_cast<size_t>(size));
        record->init_size = static_cast<uint32_t>(size);
    }
}

// A server started on a connection its predecessor opened: libfuse answers nothing but INIT until
// it has seen one, so it is shown the connection's (its reply, to an id the kernel never gave,
// is refused and ignored).
void replay_init(fuse_session* session, const ServerRecord* record) {
    if (record == nullptr || record->init_size < sizeof(RequestHeader) ||
        record->init_size > sizeof record->init) {
        return;
    }
    std::vector<unsigned char> init(record->init, record->init + record->init_size);
    RequestHeader header;
    std::memcpy(&header, init.data(), sizeof header);
    header.unique = kReplayedUnique;
    std::memcpy(init.data(), &header, sizeof header);
    fuse_buf buffer{};
    buffer.size = init.size();
    buffer.mem = init.data();
    fuse_session_process_buf(session, &buffer);
}

int run_request_loop(fuse_session* session, int fuse_fd) {
    using Clock = std::chrono::steady_clock;
    constexpr auto kSpinBudget = std::chrono::microseconds(kSpinMicroseconds);
    const int flags = fcntl(fuse_fd, F_GETFL);
    if (flags < 0 || fcntl(fuse_fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    fuse_buf buffer{};
    auto last_request = Clock::now();
    while (!fuse_session_exited(session)) {
        int received = fuse_session_receive_buf(session, &buffer);
        if (received == -EINTR) continue;
        if (received == -EAGAIN) {
            if (Clock::now() - last_request < kSpinBudget) continue;
            pollfd pfd{fuse_fd, POLLIN, 0};
            if (poll(&pfd, 1, -1) < 0 && errno != EINTR) return -errno;
            continue;
        }
        if (received <= 0) return received == -ENODEV ? 0 : received;  // ENODEV: unmounted
        note_request(g_options.record, buffer, received);
        fuse_session_process_buf(session, &buffer);
        last_request = Clock::now();
    }
    std::free(buffer.mem);
    return 0;
}

}  // namespace

fuse_session* new_squashfs_session(sqfs_ll* image, const SquashfsServerOptions& options) {
    g_prefetcher = nullptr;
    g_prefetcher_storage.reset();
    g_options = options;
    g_names = ImageNames();
    g_checked_inodes.clear();
    g_splice = false;
    fuse_lowlevel_ops ops = make_operations(options.file_opens);
    char program[] = "sqbox-fuse";
    char* argv[] = {program, nullptr};
    fuse_args args = FUSE_ARGS_INIT(1, argv);
    fuse_session* session = fuse_session_new(&args, &ops, sizeof ops, image);
    if (session == nullptr) return nullptr;
    try {
        if (!options.mount_point.empty()) {
            g_prefetcher =
                &g_prefetcher_storage.emplace(options.mount_point, g_names, PrefetchLimits{});
        }
    } catch (const std::system_error&) {
        // No thread to be had: every read is still answered, only without prefetching.
    }
    return session;
}

int serve_squashfs(sqfs_ll* image, int fuse_fd, const SquashfsServerOptions& options) {
    // libsquashfuse allocates a block-sized buffer per cache miss; keep those on the heap instead
    // of a fresh mmap (and page faults) each time.
    (void)mallopt(M_MMAP_THRESHOLD, 8 * 1024 * 1024);
    (void)mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    fuse_session* session = new_squashfs_session(image, options);
    if (session == nullptr) return -1;
    // "/dev/fd/N" tells libfuse the device is already open and mounted: it mounts nothing itself
    // and never runs fusermount.
    std::string device = "/dev/fd/" + std::to_string(fuse_fd);
    int status = fuse_session_mount(session, device.c_str());
    if (status == 0) replay_init(session, options.record);
    if (status == 0) status = run_request_loop(session, fuse_fd);
    // No fuse_session_destroy(): the process exits right after, and destroy would touch the
    // (already gone) mount.
    return status;
}

}  // namespace sqbox

#include "image/image_source.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "image/block_decoders.h"
#include "image/squashfs_guards.h"
#include "image/squashfuse_api.h"
#include "util/errors.h"

namespace sqbox {

void SquashfsDeleter::operator()(sqfs_ll* ll) const {
    sqfs_ll_destroy(ll);
    std::free(ll);
}

namespace {

std::string describe(sqfs_err err) {
    switch (err) {
        case SQFS_BADFORMAT:
            return "not a squashfs image";
        case SQFS_BADVERSION:
            return "unsupported squashfs version";
        case SQFS_BADCOMP:
            return "squashfs compression not supported by this build";
        case SQFS_UNSUP:
            return "unsupported squashfs feature";
        default:
            return "corrupt or truncated squashfs image";
    }
}

SquashfsHandle load_squashfs(int fd, const std::string& path, off_t file_size) {
    // calloc: libsquashfuse expects a zeroed struct it can later free().
    SquashfsHandle ll(static_cast<sqfs_ll*>(std::calloc(1, sizeof(sqfs_ll))));
    if (!ll) throw Error("out of memory opening image " + path);

    // sqfs_init prints nothing but reads the superblock and the id/fragment/export tables.
    sqfs_err err = sqfs_init(&ll->fs, fd, 0);
    forget_block_list_positions();
    if (err != SQFS_OK) {
        std::free(ll.release());
        throw Error("image " + path + ": " + describe(err));
    }
    use_fastest_block_decoder(&ll->fs);
    if (static_cast<uint64_t>(file_size) < ll->fs.sb.bytes_used) {
        throw Error("image " + path + ": truncated squashfs image (" + std::to_string(file_size) +
                    " of " + std::to_string(ll->fs.sb.bytes_used) + " bytes)");
    }
    // Every size computation divides by the block size: squashfs allows 4 KiB to 1 MiB, powers
    // of two.
    const uint32_t block_size = ll->fs.sb.block_size;
    if (block_size < 4096 || block_size > (1U << 20) || (block_size & (block_size - 1)) != 0) {
        throw Error("image " + path + ": corrupt squashfs image (block size " +
                    std::to_string(block_size) + ")");
    }
    err = sqfs_ll_init(ll.get());
    if (err != SQFS_OK) throw Error("image " + path + ": " + describe(err));

    sqfs_inode root;
    if (checked_root_inode(&ll->fs, &root) != SQFS_OK || !S_ISDIR(root.base.mode)) {
        throw Error("image " + path + ": corrupt squashfs image (unreadable root directory)");
    }
    return ll;
}

}  // namespace

ImageSource open_image(const std::string& path) {
    ImageSource image;
    image.path = path;
    // O_NONBLOCK so that a FIFO given by mistake cannot hang us; it is rejected below.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd) throw system_error("cannot open image " + path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw system_error("cannot stat image " + path);

    if (S_ISDIR(st.st_mode)) {
        image.kind = ImageSource::Kind::kDirectory;
        return image;
    }
    if (!S_ISREG(st.st_mode)) {
        throw Error("image " + path + ": neither a squashfs file nor a directory");
    }
    int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
        throw system_error("cannot configure image " + path);
    }
    image.kind = ImageSource::Kind::kSquashfs;
    image.squashfs = load_squashfs(fd.get(), path, st.st_size);
    image.file = std::move(fd);
    return image;
}

}  // namespace sqbox

// Opening and validating the IMAGE argument: a squashfs file (served later over FUSE) or a
// directory that already holds a root filesystem.
#pragma once

#include <memory>
#include <string>

#include "util/unique_fd.h"

struct sqfs_ll;

namespace sqbox {

struct SquashfsDeleter {
    void operator()(sqfs_ll* ll) const;
};
using SquashfsHandle = std::unique_ptr<sqfs_ll, SquashfsDeleter>;

struct ImageSource {
    enum class Kind { kSquashfs, kDirectory };
    Kind kind = Kind::kDirectory;
    std::string path;         // absolute path as given (directory images are bound from here)
    UniqueFd file;            // the open .sqsh file (kSquashfs only)
    SquashfsHandle squashfs;  // superblock, tables and inode map, ready to serve (kSquashfs only)
};

// Opens `path`, checks that it is a usable squashfs image (magic, version, compression, not
// truncated, root inode readable) or a directory. Throws Error with a one-line explanation.
ImageSource open_image(const std::string& path);

}  // namespace sqbox

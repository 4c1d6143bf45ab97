// Resolving a path inside a squashfs image without mounting it, the way the sandbox's kernel
// would resolve it on the mounted image: symlinks followed (an absolute target starts again at
// the image's root), ".." never above the root, at most 40 symlinks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "image/squashfuse_api.h"

namespace sqbox {

// One component of a resolved path: its name in its directory and its inode.
struct ImagePathStep {
    std::string name;
    sqfs_inode inode;
};

// The components of `path` (absolute or relative to the root) once every symlink on the way,
// the last one included, is followed: each a directory but the last, none of them a symlink.
// Empty for the root itself; nullopt if a name is missing, a component that must be a directory
// is not one, there are too many symlinks or the image cannot be read.
// `lookups_left`, when given, is a budget of directory lookups shared by many calls: each lookup
// takes one, and a call that runs out returns nullopt. Symlink targets longer than 4095 bytes
// and resolved paths longer than 4096 bytes are refused, as the kernel refuses them.
std::optional<std::vector<ImagePathStep>> resolve_image_path(sqfs* fs, const std::string& path,
                                                             size_t* lookups_left = nullptr);

// "/a/b/c" for the steps a, b, c; "/" for none.
std::string image_path_of(const std::vector<ImagePathStep>& steps);

}  // namespace sqbox

#include "image/image_names.h"

#include <vector>

namespace sqbox {
namespace {

// The serving thread's inode number for the mount's root directory (FUSE_ROOT_ID).
constexpr fuse_ino_t kRootInode = 1;

// Names nested deeper than this are not followed back to the root (a loop would be a bug).
constexpr int kMaxDepth = 256;

// Names remembered: about 100 bytes each. A payload that looks up every file of a huge image
// (ls -lR) would otherwise grow the server without bound; past this, later names are unknown.
constexpr size_t kMaxNames = size_t{1} << 16;

}  // namespace

void ImageNames::add(fuse_ino_t parent, const char* name, fuse_ino_t ino) {
    if (names_.size() < kMaxNames) names_.try_emplace(ino, Name{parent, name});
}

std::string ImageNames::path_of(fuse_ino_t ino) const {
    if (ino == kRootInode) return "/";
    std::vector<const std::string*> parts;
    for (int depth = 0; ino != kRootInode; ++depth) {
        auto found = names_.find(ino);
        if (found == names_.end() || depth == kMaxDepth) return "";
        parts.push_back(&found->second.name);
        ino = found->second.parent;
    }
    std::string path;
    for (auto part = parts.rbegin(); part != parts.rend(); ++part) path += "/" + **part;
    return path;
}

}  // namespace sqbox

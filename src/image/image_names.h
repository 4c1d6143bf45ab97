// The image server's map from the inode numbers it handed out to the names they were found under,
// so that an inode's path can be rebuilt (the read-ahead worker opens files by path). Filled by the
// serving thread from its lookups; used only on that thread.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

#include "image/squashfuse_api.h"

namespace sqbox {

class ImageNames {
  public:
    // The inode `ino` was found as `name` in the directory `parent`. The first name wins for
    // hard links: any path to the inode will do.
    void add(fuse_ino_t parent, const char* name, fuse_ino_t ino);

    // The absolute path inside the image of a looked-up inode ("/" for the root), or "" when it
    // is not known.
    std::string path_of(fuse_ino_t ino) const;

  private:
    struct Name {
        fuse_ino_t parent;
        std::string name;
    };
    std::unordered_map<fuse_ino_t, Name> names_;
};

}  // namespace sqbox

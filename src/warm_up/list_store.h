// Where images' warm-up lists (warm_up/warm_up_list.h) are kept: one file per image in a directory
// of the caller's own (sqbox_cache_directory()/warm-up), named after the image's first and last
// 4 KiB and its size: a copy of the image finds its list, a rebuilt image (other tables, other
// size) almost always starts afresh. A key, not a proof of identity: an image made to match
// another's gets that image's list, which only names what a learning run looked up.
//
// Lists are replaced by a rename, under a lock (DIRECTORY/.lock) that learning runs hold while
// they read, merge and write: concurrent learning runs each add their names, and readers see the
// old list or the new one. The directory must be the caller's and writable by nobody else, or
// its lists are neither read nor written.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "image/squashfuse_api.h"
#include "warm_up/warm_up_list.h"

namespace sqbox {

// Throws Error unless `directory` is a directory of the caller's that nobody else can write:
// lists (and the files unpacked for them) are only read from and written to such a directory,
// since in one that others can write they could swap them under the caller's runs.
void check_private_directory(const std::string& directory);

// The list's file name for the squashfs image open at `image_fd`. Throws Error if the image
// cannot be read.
std::string warm_up_list_name(int image_fd);

// The list at `path`: empty if there is none, nullopt if the file is not a list (or is a
// symlink). Throws Error, with the reason, for a file that cannot be read or a directory that is
// not private.
std::optional<std::vector<WarmUpName>> load_warm_up_list(const std::string& path);

// Where an image may carry a list of its own, made when the image was built (images/build does
// for the recipes that name a warm-up command): runs use it while the caller has learned none.
inline constexpr const char* kImageWarmUpListPath = "/etc/sqbox/warm-up";

// The list the squashfs image `fs` carries (kImageWarmUpListPath, a symlink followed inside the
// image): empty if it has none, nullopt if that file is not a list or is over 1 MiB.
std::optional<std::vector<WarmUpName>> load_image_warm_up_list(sqfs* fs);

struct SavedWarmUpList {
    size_t names = 0;  // in the list now
    size_t added = 0;  // of those, new
};

// Adds `learned` to the list at `path` (creating its directory, mode 0700): the list as it is
// now, read under the lock, then the new names. A file there that is not a list is replaced.
// Throws Error naming the path if the list cannot be read or saved; leaves no temporary file.
SavedWarmUpList add_to_warm_up_list(const std::string& path,
                                    const std::vector<WarmUpName>& learned);

}  // namespace sqbox

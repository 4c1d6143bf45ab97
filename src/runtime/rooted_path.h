// Resolving paths inside the sandbox's root without ever following a symlink, so neither a
// hostile image nor a user-given destination can point a mount or a write outside the root.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

// kAny: whatever exists there (never created).
enum class EntryKind { kDirectory, kFile, kAny };

// Returns an O_PATH fd for `path` (absolute, inside the root) resolved component by component
// below `root_fd`. Missing components are created when `create` is true: directories, and the last
// one as `last_kind`. Throws Error if any component is a symlink, if the path contains "..", or if
// the last component exists with the wrong kind.
UniqueFd resolve_in_root(int root_fd, const std::string& path, EntryKind last_kind, bool create,
                         const std::string& what);

// The image's file at `relative_path`, resolved inside `root_fd` (its symlinks cannot leave it,
// nor cross a mount), read only if it is a regular file of at most `max_bytes` (O_NONBLOCK and
// O_NOCTTY: a FIFO or a device opens nothing that waits or attaches). "" when it does not exist.
// Throws Error naming `what` otherwise.
std::string read_image_file(int root_fd, const char* relative_path, size_t max_bytes,
                            const std::string& what);

// Splits "/a/b/c" into its normalised components; throws on "..".
std::vector<std::string> path_components(const std::string& path, const std::string& what);

}  // namespace sqbox

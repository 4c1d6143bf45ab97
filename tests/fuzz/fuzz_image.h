// What the fuzz targets share: an input opened as an image the way sqbox opens one, and the
// inodes of an image found by walking it with libsquashfuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "image/image_source.h"
#include "image/squashfuse_api.h"

namespace sqbox::fuzz {

// `data` in a memory file, opened with open_image (sqbox's own validation included); nullopt if
// open_image refuses it, as sqbox would refuse it before serving.
std::optional<ImageSource> open_fuzz_image(const uint8_t* data, size_t size);

// Calls `visit` with the absolute path and inode of every entry below the root (the root
// included, as "/"), depth first, within `max_entries`; stops at the first error. Names the
// kernel would refuse from the FUSE server (empty, ".", "..", with a '/') are left out.
void walk_image(sqfs* fs, size_t max_entries,
                const std::function<void(const std::string& path, sqfs_inode& inode)>& visit);

// A directory made once per process for the targets' scratch files (a tmpfs if there is one).
const std::string& scratch_directory();

}  // namespace sqbox::fuzz

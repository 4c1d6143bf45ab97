// Fuzz targets over the code that reads squashfs images (the image is hostile input: it may come
// from a public registry). Each takes one input, the bytes of an image, and must neither crash
// nor trip a sanitizer on any input. They are built as libFuzzer programs with -DSQBOX_FUZZ=ON
// (scripts/fuzz runs them) and linked into the unit tests, which replay the inputs kept in
// tests/fuzz/regressions/TARGET/ (tests/unit/fuzz_regressions_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sqbox::fuzz {

// The image server's operations (lookup, getattr, readdir, readlink, read with and without
// splicing, statfs, forget, xattrs) driven through libfuse with FUSE requests made in memory, no
// kernel mount: a walk of the whole tree, reading every file, then the stored extents of each
// file checked against libsquashfuse's reading of it.
void image_server(const uint8_t* data, size_t size);

// Export: the files of the image, written back to a new image with
// squashfs_writer, which must read back the same.
void image_export(const uint8_t* data, size_t size);

struct Target {
    const char* name;
    void (*run)(const uint8_t* data, size_t size);
};

inline constexpr Target kTargets[] = {
    {"image_server", image_server},
    {"image_export", image_export},
};

}  // namespace sqbox::fuzz

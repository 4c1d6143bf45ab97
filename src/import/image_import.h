// `sqbox import`'s last step: an image's layers and configuration (import/image_layers.h) become
// one squashfs image with enroot's files in it, without unpacking a root filesystem anywhere.
//
// Two passes over the layers: the first reads only their headers and builds the final tree in
// memory (import/layer_tree.h: whiteouts, opaque directories, later layers over earlier ones);
// the second streams the data of the files that survive, from the layer that holds each, straight
// into the image. Memory is the tree's metadata, whatever the size of the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "image/squashfs_builder.h"
#include "import/image_layers.h"

namespace sqbox {

// RLIMIT_DATA of the process that reads the layers and writes the image (see
// security/parser_process.h): its heap (the tree: some 400 bytes per entry), thread stacks (8 MiB
// per compressor thread, one per CPU) and the compressor's buffers. Measured peaks (VmData, two
// CPUs): the python test image (3,948 entries, 101 MiB) 35 MiB; a layer of 200,000 empty files
// 106 MiB. A million files, or a hundred CPUs, stay well below.
inline constexpr uint64_t kLayerReaderDataLimitBytes = uint64_t{4} << 30;

struct ImportOptions {
    SquashfsCompression compression = SquashfsCompression::zstd;
    std::string provenance;                    // the URI, for /etc/rc's first line
    std::optional<int64_t> source_date_epoch;  // time of the files sqbox adds (else now)
};

// Writes the image to `output`, which must not exist: to a temporary file beside it first, renamed
// into place at the end (never over a file that appeared meanwhile); on any failure nothing is
// left behind and an Error with one line says why. The layers are read and the image written by
// a child process confined before it reads any layer (security/parser_process.h), which is given
// the layers and the temporary file as open descriptors; a child that dies is reported as "the
// image's layers could not be read: ... (the reader crashed)" or "(... ran out of memory)".
void write_image_from_layers(const ImageLayers& image, const std::filesystem::path& output,
                             const ImportOptions& options);

// "<dir>/.<name>.<random>.tmp": where write_image_from_layers and the archive sources keep
// temporary files; removed by them on every path out.
std::filesystem::path temporary_path_beside(const std::filesystem::path& output);

}  // namespace sqbox

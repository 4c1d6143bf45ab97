// The decoders of an image's compressed blocks, where sqbox has a faster one than the one
// libsquashfuse picks.
//
// - zlib blocks (mksquashfs's default compressor, "gzip") are decoded by libdeflate instead of
//   zlib's uncompress(): about 2.4 times as fast on whole blocks (bench/block_decoding.py), and a
//   first run of a gzip image spent most of its image server's time there.
// - zstd blocks by one decompression context per thread, kept, where libsquashfuse's
//   ZSTD_decompress() makes and frees one for every block (about 8% of the decoding).
// lzo, lz4 and xz keep libsquashfuse's decoders.
#pragma once

#include <cstddef>

#include "image/squashfuse_api.h"

namespace sqbox {

// Replaces fs->decompressor for the compressors above; leaves it alone for the rest.
void use_fastest_block_decoder(sqfs* fs);

// The zlib decoder, with libsquashfuse's decompressor contract: decodes the whole zlib stream
// `in` into `out`, at most *out_size bytes; *out_size becomes the decoded size. SQFS_ERR for a
// stream that is corrupt, truncated, fails its checksum, or decodes to more than *out_size.
sqfs_err decode_zlib_block(void* in, size_t in_size, void* out, size_t* out_size);

// The same for a zstd frame.
sqfs_err decode_zstd_block(void* in, size_t in_size, void* out, size_t* out_size);

}  // namespace sqbox

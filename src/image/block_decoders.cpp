#include "image/block_decoders.h"

#include <libdeflate.h>
#include <zstd.h>

#include <memory>

extern "C" {
#include <squashfuse/squashfs_fs.h>
}

namespace sqbox {

namespace {

struct DecompressorDeleter {
    void operator()(libdeflate_decompressor* decompressor) const {
        libdeflate_free_decompressor(decompressor);
    }
    void operator()(ZSTD_DCtx* context) const { ZSTD_freeDCtx(context); }
};

}  // namespace

sqfs_err decode_zlib_block(void* in, size_t in_size, void* out, size_t* out_size) {
    // A decompressor holds state while it decodes, so each thread that decodes has its own, made
    // at its first block (and again after an allocation that failed).
    thread_local std::unique_ptr<libdeflate_decompressor, DecompressorDeleter> decompressor;
    if (!decompressor) decompressor.reset(libdeflate_alloc_decompressor());
    if (!decompressor) return SQFS_ERR;
    size_t decoded = 0;
    if (libdeflate_zlib_decompress(decompressor.get(), in, in_size, out, *out_size, &decoded) !=
        LIBDEFLATE_SUCCESS) {
        return SQFS_ERR;
    }
    *out_size = decoded;
    return SQFS_OK;
}

sqfs_err decode_zstd_block(void* in, size_t in_size, void* out, size_t* out_size) {
    thread_local std::unique_ptr<ZSTD_DCtx, DecompressorDeleter> context;
    if (!context) context.reset(ZSTD_createDCtx());
    if (!context) return SQFS_ERR;
    const size_t decoded = ZSTD_decompressDCtx(context.get(), out, *out_size, in, in_size);
    if (ZSTD_isError(decoded) != 0) return SQFS_ERR;
    *out_size = decoded;
    return SQFS_OK;
}

void use_fastest_block_decoder(sqfs* fs) {
    if (fs->sb.compression == ZLIB_COMPRESSION) fs->decompressor = decode_zlib_block;
    if (fs->sb.compression == ZSTD_COMPRESSION) fs->decompressor = decode_zstd_block;
}

}  // namespace sqbox

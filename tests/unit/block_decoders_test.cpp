#include "image/block_decoders.h"

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <squashfuse/squashfs_fs.h>
}

namespace sqbox {
namespace {

// What mksquashfs writes for a gzip image's block: a zlib stream, at its default level 9.
std::string zlib_stream(const std::string& data) {
    uLongf size = compressBound(data.size());
    std::string stream(size, '\0');
    EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(stream.data()), &size,
                        reinterpret_cast<const Bytef*>(data.data()), data.size(), 9),
              Z_OK);
    stream.resize(size);
    return stream;
}

// ...and for a zstd image's: a zstd frame (mksquashfs's default level, 15).
std::string zstd_frame(const std::string& data) {
    std::string frame(ZSTD_compressBound(data.size()), '\0');
    const size_t size = ZSTD_compress(frame.data(), frame.size(), data.data(), data.size(), 15);
    EXPECT_EQ(ZSTD_isError(size), 0U);
    frame.resize(size);
    return frame;
}

constexpr size_t kBlock = size_t{128} * 1024;
constexpr size_t kHalfBlock = kBlock / 2;

std::string block_of(size_t size) {
    std::string data;
    for (size_t i = 0; data.size() < size; ++i) data += "line " + std::to_string(i * 7919) + "\n";
    data.resize(size);
    return data;
}

sqfs_err decode(std::string stream, std::string& out, size_t capacity,
                sqfs_decompressor decoder = decode_zlib_block) {
    out.assign(capacity, '\0');
    size_t size = capacity;
    const sqfs_err err = decoder(stream.data(), stream.size(), out.data(), &size);
    out.resize(err == SQFS_OK ? size : 0);
    return err;
}

TEST(BlockDecoders, DecodesAZlibBlockToItsBytes) {
    const std::string data = block_of(kBlock);
    std::string out;
    ASSERT_EQ(decode(zlib_stream(data), out, kBlock), SQFS_OK);
    EXPECT_EQ(out, data);
    // A block shorter than the room given (a file's last block, a fragment block).
    ASSERT_EQ(decode(zlib_stream(data.substr(0, 3000)), out, kBlock), SQFS_OK);
    EXPECT_EQ(out, data.substr(0, 3000));
}

TEST(BlockDecoders, RefusesCorruptTruncatedAndOversizedBlocks) {
    const std::string data = block_of(kHalfBlock);
    const std::string stream = zlib_stream(data);
    std::string out;
    // A changed byte of the zlib header or of the Adler-32 at the end is always refused.
    for (const size_t at : {size_t{0}, size_t{1}, stream.size() - 4, stream.size() - 1}) {
        std::string flipped = stream;
        flipped[at] = static_cast<char>(flipped[at] ^ 0x20);
        EXPECT_EQ(decode(flipped, out, kHalfBlock), SQFS_ERR) << "byte " << at;
    }
    // One in the deflate data is refused by the decoder, or by the checksum where it still
    // decodes; Adler-32 is weak, so a few decode to other bytes with a matching sum. Whatever
    // decodes stays within the room given.
    size_t refused = 0;
    size_t tried = 0;
    for (size_t at = 2; at + 4 < stream.size(); at += 97) {
        std::string flipped = stream;
        flipped[at] = static_cast<char>(flipped[at] ^ 0x20);
        ++tried;
        if (decode(flipped, out, kHalfBlock) == SQFS_ERR) {
            ++refused;
        } else {
            EXPECT_LE(out.size(), kHalfBlock) << "byte " << at;
        }
    }
    EXPECT_GE(refused * 10, tried * 9) << refused << " of " << tried << " changes refused";
    EXPECT_EQ(decode(stream.substr(0, stream.size() / 2), out, kHalfBlock), SQFS_ERR);
    EXPECT_EQ(decode(stream.substr(0, stream.size() - 1), out, kHalfBlock), SQFS_ERR);
    EXPECT_EQ(decode("", out, kHalfBlock), SQFS_ERR);
    // More than the block may hold: refused, not written past the room given.
    EXPECT_EQ(decode(stream, out, kHalfBlock - 1), SQFS_ERR);
    // Data stored raw (deflate without the zlib wrapper) is not a zlib stream.
    EXPECT_EQ(decode(stream.substr(2), out, kHalfBlock), SQFS_ERR);
}

TEST(BlockDecoders, DecodesZstdFramesAndRefusesBadOnes) {
    const std::string data = block_of(kBlock);
    const std::string frame = zstd_frame(data);
    std::string out;
    // One context serves block after block, of any size.
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(decode(frame, out, kBlock, decode_zstd_block), SQFS_OK);
        EXPECT_EQ(out, data);
        ASSERT_EQ(decode(zstd_frame(data.substr(0, 777)), out, kBlock, decode_zstd_block), SQFS_OK);
        EXPECT_EQ(out, data.substr(0, 777));
    }
    EXPECT_EQ(decode(frame.substr(0, frame.size() / 2), out, kBlock, decode_zstd_block), SQFS_ERR);
    EXPECT_EQ(decode(frame, out, kBlock - 1, decode_zstd_block), SQFS_ERR);
    EXPECT_EQ(decode("not a zstd frame", out, kBlock, decode_zstd_block), SQFS_ERR);
    // After a refused frame, the context decodes the next good one.
    ASSERT_EQ(decode(frame, out, kBlock, decode_zstd_block), SQFS_OK);
    EXPECT_EQ(out, data);
}

TEST(BlockDecoders, ThreadsDecodeAtOnce) {
    // The serving thread and the read-ahead thread decode at the same time, each with its own
    // decompressor.
    const std::string data = block_of(kBlock);
    const std::string stream = zlib_stream(data);
    const std::string frame = zstd_frame(data);
    std::vector<std::thread> threads;
    threads.reserve(4);
    std::vector<int> good(4, 0);
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            std::string out;
            for (int i = 0; i < 25; ++i) {
                good[t] += decode(stream, out, kBlock) == SQFS_OK && out == data;
                good[t] += decode(frame, out, kBlock, decode_zstd_block) == SQFS_OK && out == data;
            }
        });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(good, std::vector<int>(4, 50));
}

TEST(BlockDecoders, OnlyZlibAndZstdImagesGetSqboxsDecoders) {
    sqfs_decompressor const library_decoder = [](void*, size_t, void*, size_t*) { return SQFS_OK; };
    for (const int compression :
         {LZO_COMPRESSION, LZMA_COMPRESSION, XZ_COMPRESSION, LZ4_COMPRESSION}) {
        sqfs fs{};
        fs.sb.compression = static_cast<uint16_t>(compression);
        fs.decompressor = library_decoder;
        use_fastest_block_decoder(&fs);
        EXPECT_EQ(fs.decompressor, library_decoder) << compression;
    }
    sqfs fs{};
    fs.sb.compression = ZLIB_COMPRESSION;
    fs.decompressor = library_decoder;
    use_fastest_block_decoder(&fs);
    EXPECT_EQ(fs.decompressor, &decode_zlib_block);
    fs.sb.compression = ZSTD_COMPRESSION;
    use_fastest_block_decoder(&fs);
    EXPECT_EQ(fs.decompressor, &decode_zstd_block);
}

}  // namespace
}  // namespace sqbox

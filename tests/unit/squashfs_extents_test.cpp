// find_stored_extents on images mksquashfs makes: the ranges it names must hold exactly the file's
// bytes, and it must decline whatever needs decoding.
#include "image/squashfs_extents.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "image/image_source.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlock = size_t{128} << 10;

bool have_mksquashfs() {
    return std::system("mksquashfs -version >/dev/null 2>&1") == 0;
}

class StoredExtentsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!have_mksquashfs()) GTEST_SKIP() << "mksquashfs (squashfs-tools) is not installed";
        char pattern[] = "/tmp/sqbox-extents-XXXXXX";
        dir_ = ::mkdtemp(pattern);
        fs::create_directory(dir_ / "tree");
        // Three full blocks and a 1000-byte tail, random so that no block is worth compressing.
        std::mt19937 random(42);
        content_.resize(3 * kBlock + 1000);
        for (char& byte : content_) byte = static_cast<char>(random());
        std::ofstream(dir_ / "tree" / "file", std::ios::binary) << content_;
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }

    // Builds an image of the tree with `options` and returns it open, with the file's inode.
    ImageSource build(const std::string& name, const std::string& options, sqfs_inode& inode) {
        const fs::path image = dir_ / name;
        const std::string command = "mksquashfs " + (dir_ / "tree").string() + " " +
                                    image.string() + " -quiet -no-progress -noappend " + options +
                                    " >/dev/null 2>&1";
        EXPECT_EQ(std::system(command.c_str()), 0) << command;
        ImageSource source = open_image(image.string());
        bool found = false;
        // The lookup walks from the inode it is given: the root.
        EXPECT_EQ(
            sqfs_inode_get(&source.squashfs->fs, &inode, sqfs_inode_root(&source.squashfs->fs)),
            SQFS_OK);
        EXPECT_EQ(sqfs_lookup_path(&source.squashfs->fs, &inode, "/file", &found), SQFS_OK);
        EXPECT_TRUE(found);
        return source;
    }

    // The image bytes the extents name, concatenated.
    static std::string bytes_at(const ImageSource& image, const std::vector<ImageExtent>& extents) {
        std::string out;
        for (const auto& extent : extents) {
            std::string piece(extent.length, '\0');
            EXPECT_EQ(::pread(image.file.get(), piece.data(), piece.size(),
                              static_cast<off_t>(extent.image_offset)),
                      static_cast<ssize_t>(piece.size()));
            out += piece;
        }
        return out;
    }

    fs::path dir_;
    std::string content_;
};

TEST_F(StoredExtentsTest, StoredBlocksMapToTheImageBytesOfTheFile) {
    sqfs_inode inode;
    ImageSource image = build("stored.sqsh", "-noD -no-fragments", inode);
    std::vector<ImageExtent> extents;
    sqfs* fs = &image.squashfs->fs;

    // The whole file: its blocks lie one after another, so one extent.
    ASSERT_TRUE(find_stored_extents(fs, &inode, 0, content_.size(), extents));
    EXPECT_EQ(extents.size(), 1U);
    EXPECT_EQ(bytes_at(image, extents), content_);

    // Ranges that start and end inside blocks, and the short last block.
    for (auto [offset, length] : {std::pair<size_t, size_t>{5, 100},
                                  {kBlock - 10, 20},
                                  {kBlock + 1, 2 * kBlock},
                                  {3 * kBlock, 1000},
                                  {3 * kBlock + 999, 1}}) {
        ASSERT_TRUE(find_stored_extents(fs, &inode, offset, length, extents)) << offset;
        EXPECT_EQ(bytes_at(image, extents), content_.substr(offset, length)) << offset;
    }

    // Past the end of the file, or nothing at all: declined.
    EXPECT_FALSE(find_stored_extents(fs, &inode, 3 * kBlock + 999, 2, extents));
    EXPECT_FALSE(find_stored_extents(fs, &inode, 0, 0, extents));
}

TEST_F(StoredExtentsTest, BlocksOutsideTheImagesUsedSizeAreDeclined) {
    // A crafted image whose block list points past the data it declares: as if the superblock
    // said the image ends after the file's first block.
    sqfs_inode inode;
    ImageSource image = build("short.sqsh", "-noD -no-fragments", inode);
    sqfs* fs = &image.squashfs->fs;
    std::vector<ImageExtent> extents;
    ASSERT_TRUE(find_stored_extents(fs, &inode, 0, kBlock, extents));
    fs->sb.bytes_used = extents.front().image_offset + kBlock;
    EXPECT_TRUE(find_stored_extents(fs, &inode, 0, kBlock, extents));
    EXPECT_FALSE(find_stored_extents(fs, &inode, kBlock, 10, extents));
    EXPECT_FALSE(find_stored_extents(fs, &inode, 0, content_.size(), extents));
}

TEST_F(StoredExtentsTest, FragmentTailsAndCompressedBlocksAreDeclined) {
    std::vector<ImageExtent> extents;
    {
        // enroot's default layout, with tails always in (compressed) fragment blocks: the full
        // blocks map, the tail does not.
        sqfs_inode inode;
        ImageSource image = build("enroot.sqsh", "-comp lz4 -noD -always-use-fragments", inode);
        sqfs* fs = &image.squashfs->fs;
        ASSERT_TRUE(find_stored_extents(fs, &inode, 0, 3 * kBlock, extents));
        EXPECT_EQ(bytes_at(image, extents), content_.substr(0, 3 * kBlock));
        EXPECT_FALSE(find_stored_extents(fs, &inode, 3 * kBlock, 10, extents));
        EXPECT_FALSE(find_stored_extents(fs, &inode, 0, content_.size(), extents));
    }
    {
        // A file smaller than a block lives in a fragment block whole.
        std::ofstream(dir_ / "tree" / "file", std::ios::binary) << content_.substr(0, 1000);
        sqfs_inode inode;
        ImageSource image = build("small.sqsh", "-comp lz4 -noD", inode);
        EXPECT_FALSE(find_stored_extents(&image.squashfs->fs, &inode, 0, 1000, extents));
    }
    {
        // Compressed data blocks: mksquashfs keeps random data stored even so, so compressible
        // data goes in this file.
        std::ofstream(dir_ / "tree" / "file", std::ios::binary)
            << std::string(content_.size(), 'a');
        sqfs_inode inode;
        ImageSource image = build("compressed.sqsh", "-comp lz4 -no-fragments", inode);
        EXPECT_FALSE(find_stored_extents(&image.squashfs->fs, &inode, 0, kBlock, extents));
    }
}

}  // namespace
}  // namespace sqbox

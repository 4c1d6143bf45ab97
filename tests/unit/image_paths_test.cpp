// resolve_image_path on an image mksquashfs makes: symlinks are followed inside the image, as the
// sandbox's kernel would follow them on the mounted image, and nothing leads out of it.
#include "image/image_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "image/image_source.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

class ImagePathsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (std::system("mksquashfs -version >/dev/null 2>&1") != 0) {
            GTEST_SKIP() << "mksquashfs (squashfs-tools) is not installed";
        }
        char pattern[] = "/tmp/sqbox-image-paths-XXXXXX";
        dir_ = ::mkdtemp(pattern);
        const fs::path tree = dir_ / "tree";
        fs::create_directories(tree / "a" / "b");
        std::ofstream(tree / "a" / "b" / "file") << "content\n";
        fs::create_directory_symlink("/a/b", tree / "absolute");
        fs::create_symlink("a/b/file", tree / "relative");
        fs::create_directory_symlink("../../../../../a", tree / "a" / "up");
        fs::create_symlink("loop-2", tree / "loop-1");
        fs::create_symlink("loop-1", tree / "loop-2");
        fs::create_symlink("/nowhere", tree / "dangling");
        fs::create_symlink("/tmp/sqbox-image-paths-host-file", tree / "host");
        const fs::path image = dir_ / "image.sqsh";
        const std::string command = "mksquashfs " + tree.string() + " " + image.string() +
                                    " -quiet -no-progress -noappend -all-root >/dev/null 2>&1";
        ASSERT_EQ(std::system(command.c_str()), 0) << command;
        image_ = open_image(image.string());
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }

    // The canonical path `path` resolves to, or "(none)".
    std::string resolved(const std::string& path) {
        std::optional<std::vector<ImagePathStep>> steps =
            resolve_image_path(&image_.squashfs->fs, path);
        return steps ? image_path_of(*steps) : "(none)";
    }

    fs::path dir_;
    ImageSource image_;
};

TEST_F(ImagePathsTest, PlainPathsResolveToThemselves) {
    EXPECT_EQ(resolved("/a/b/file"), "/a/b/file");
    EXPECT_EQ(resolved("a/b/file"), "/a/b/file");
    EXPECT_EQ(resolved("//a/./b//file"), "/a/b/file");
    EXPECT_EQ(resolved("/"), "/");
    EXPECT_EQ(resolved("/a/b"), "/a/b");
}

TEST_F(ImagePathsTest, SymlinksAreFollowedInsideTheImage) {
    EXPECT_EQ(resolved("/absolute/file"), "/a/b/file");
    EXPECT_EQ(resolved("/relative"), "/a/b/file");
    // ".." stops at the image's root, however many there are.
    EXPECT_EQ(resolved("/a/up/b/../b/file"), "/a/b/file");
    EXPECT_EQ(resolved("/../../a/b/file"), "/a/b/file");
}

TEST_F(ImagePathsTest, TheLastStepIsNeverASymlink) {
    std::optional<std::vector<ImagePathStep>> steps =
        resolve_image_path(&image_.squashfs->fs, "/relative");
    ASSERT_TRUE(steps);
    ASSERT_EQ(steps->size(), 3U);
    EXPECT_TRUE(S_ISDIR((*steps)[0].inode.base.mode));
    EXPECT_TRUE(S_ISDIR((*steps)[1].inode.base.mode));
    EXPECT_TRUE(S_ISREG((*steps)[2].inode.base.mode));
}

TEST_F(ImagePathsTest, WhatDoesNotResolveInTheImageIsRefused) {
    EXPECT_EQ(resolved("/missing"), "(none)");
    EXPECT_EQ(resolved("/dangling"), "(none)");
    EXPECT_EQ(resolved("/loop-1"), "(none)");         // symlinks in a loop: the 40-link limit
    EXPECT_EQ(resolved("/a/b/file/more"), "(none)");  // a file is not a directory
    // A symlink to a host path names that path in the image, where it does not exist, even with
    // the file present on the host.
    std::ofstream("/tmp/sqbox-image-paths-host-file") << "host\n";
    EXPECT_EQ(resolved("/host"), "(none)");
    ::unlink("/tmp/sqbox-image-paths-host-file");
}

TEST_F(ImagePathsTest, LookupsComeOutOfASharedBudget) {
    size_t budget = 5;
    // /relative -> a/b/file: four lookups (relative, a, b, file).
    EXPECT_TRUE(resolve_image_path(&image_.squashfs->fs, "/relative", &budget));
    EXPECT_EQ(budget, 1U);
    EXPECT_FALSE(resolve_image_path(&image_.squashfs->fs, "/a/b/file", &budget));
    EXPECT_EQ(budget, 0U);
    EXPECT_FALSE(resolve_image_path(&image_.squashfs->fs, "/a", &budget));
}

}  // namespace
}  // namespace sqbox

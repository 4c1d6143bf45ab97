// check_unpacked_tree: what an unpacking child taken over by its image could leave in an unpacked
// image is refused before the tree is renamed into place and run as a root filesystem.
#include "image/image_unpack.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "temp_directory.h"
#include "util/errors.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

class UnpackedTreeTest : public ::testing::Test {
  protected:
    void SetUp() override {
        temp_.emplace("unpacked-image");
        root_ = temp_->path() / "root";
        fs::create_directories(root_ / "usr" / "lib");
        std::ofstream(root_ / "usr" / "lib" / "libc.so") << "library\n";
        std::ofstream(root_ / "usr" / "empty");
        // Symlinks are part of a root filesystem, whatever they point at: never followed.
        fs::create_symlink("/etc/passwd", root_ / "usr" / "out");
        fs::create_symlink("../../../../..", root_ / "usr" / "up");
    }
    void TearDown() override { temp_.reset(); }

    bool refused(const ImageUnpackLimits& limits = {}) {
        try {
            (void)check_unpacked_tree(root_.string(), limits);
            return false;
        } catch (const Error&) {
            return true;
        }
    }

    std::optional<TempDirectory> temp_;
    fs::path root_;
};

TEST_F(UnpackedTreeTest, ATreeAsSqboxMakesItPassesWithItsCounts) {
    fs::permissions(root_ / "usr" / "lib", fs::perms::none);  // as an image may have it
    const auto [bytes, entries] = check_unpacked_tree(root_.string(), {});
    EXPECT_EQ(bytes, 8U);
    EXPECT_EQ(entries, 6U);  // usr, lib, libc.so, empty, out, up
    EXPECT_EQ(fs::status(root_ / "usr" / "lib").permissions(), fs::perms::none);
    fs::permissions(root_ / "usr" / "lib", fs::perms::owner_all);
}

TEST_F(UnpackedTreeTest, WhatSqboxNeverMakesIsRefused) {
    auto usr = [this] { return root_ / "usr"; };
    const std::vector<std::pair<std::string, std::function<void()>>> planted = {
        {"a FIFO", [&] { ASSERT_EQ(::mkfifo((usr() / "fifo").c_str(), 0600), 0); }},
        {"a hard link", [&] { fs::create_hard_link(usr() / "lib" / "libc.so", usr() / "other"); }},
        {"a setuid file",
         [&] { ASSERT_EQ(::chmod((usr() / "lib" / "libc.so").c_str(), 04755), 0); }},
        {"a setgid file",
         [&] { ASSERT_EQ(::chmod((usr() / "lib" / "libc.so").c_str(), 02755), 0); }},
        {"a setgid directory", [&] { ASSERT_EQ(::chmod(usr().c_str(), 02755), 0); }},
        {"an opaque directory",
         [&] {
             if (::setxattr(usr().c_str(), "user.overlay.opaque", "y", 1, 0) != 0) {
                 GTEST_SKIP() << "this filesystem keeps no user.* extended attributes";
             }
         }},
    };
    for (const auto& [what, plant] : planted) {
        TearDown();
        SetUp();
        plant();
        if (IsSkipped()) return;
        EXPECT_TRUE(refused()) << what;
    }
}

TEST_F(UnpackedTreeTest, TheBudgetsHold) {
    ImageUnpackLimits few;
    few.entries = 4;
    EXPECT_TRUE(refused(few));
    ImageUnpackLimits small;
    small.total_bytes = 7;
    EXPECT_TRUE(refused(small));
    ImageUnpackLimits shallow;
    shallow.depth = 1;
    EXPECT_TRUE(refused(shallow));
    EXPECT_FALSE(refused());
}

}  // namespace
}  // namespace sqbox

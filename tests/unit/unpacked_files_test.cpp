// check_made_entry: what an unpacking child taken over by its image could leave in an entry is
// refused before it is stamped and laid under a sandbox.
#include "warm_up/unpacked_files.h"

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

class MadeEntryTest : public ::testing::Test {
  protected:
    void SetUp() override {
        temp_.emplace("hot-files");
        entry_ = temp_->path() / "KEY.files.tmp";
        fs::create_directories(entry_ / "tree" / "usr" / "lib");
        std::ofstream(entry_ / "image-list") << "sqbox-warm-up 1\n";
        std::ofstream(entry_ / "tree" / "usr" / "lib" / "libc.so") << "library\n";
        std::ofstream(entry_ / "tree" / "usr" / "empty");
    }
    void TearDown() override { temp_.reset(); }

    // Whether check_made_entry refuses the entry.
    bool refused(const UnpackedFilesLimits& limits = {}) {
        try {
            (void)check_made_entry(entry_.string(), true, limits);
            return false;
        } catch (const Error&) {
            return true;
        }
    }

    std::optional<TempDirectory> temp_;
    fs::path entry_;
};

TEST_F(MadeEntryTest, AnEntryAsSqboxMakesItPassesWithItsCounts) {
    fs::permissions(entry_ / "tree" / "usr" / "lib", fs::perms::none);  // as an image may have it
    const UnpackedFilesCounts counts = check_made_entry(entry_.string(), true, {});
    EXPECT_EQ(counts.files, 2U);
    EXPECT_EQ(counts.bytes, 8U);
    // Closed again after the walk.
    EXPECT_EQ(fs::status(entry_ / "tree" / "usr" / "lib").permissions(), fs::perms::none);
    fs::permissions(entry_ / "tree" / "usr" / "lib", fs::perms::owner_all);
}

TEST_F(MadeEntryTest, WhatSqboxNeverMakesIsRefused) {
    auto usr = [this] { return entry_ / "tree" / "usr"; };
    const std::vector<std::pair<std::string, std::function<void()>>> planted = {
        {"a symlink", [&] { fs::create_symlink("/etc/passwd", usr() / "link"); }},
        {"a FIFO", [&] { ASSERT_EQ(::mkfifo((usr() / "fifo").c_str(), 0600), 0); }},
        {"a hard link", [&] { fs::create_hard_link(usr() / "lib" / "libc.so", usr() / "other"); }},
        {"a setuid file",
         [&] { ASSERT_EQ(::chmod((usr() / "lib" / "libc.so").c_str(), 04755), 0); }},
        {"a setgid file",
         [&] { ASSERT_EQ(::chmod((usr() / "lib" / "libc.so").c_str(), 02755), 0); }},
        {"a stamp of its own", [&] { std::ofstream(entry_ / "stamp") << "forged\n"; }},
        {"another file beside the tree", [&] { std::ofstream(entry_ / "extra") << "x"; }},
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

TEST_F(MadeEntryTest, TheLimitsHold) {
    UnpackedFilesLimits few;
    few.entries = 3;  // usr, lib, libc.so, empty: four
    EXPECT_TRUE(refused(few));
    UnpackedFilesLimits small;
    small.total_bytes = 7;
    EXPECT_TRUE(refused(small));
    UnpackedFilesLimits one_file;
    one_file.file_bytes = 7;
    EXPECT_TRUE(refused(one_file));
    EXPECT_FALSE(refused());
}

}  // namespace
}  // namespace sqbox

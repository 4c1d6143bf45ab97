// remove_tree: everything below goes, whatever the modes, depth or number of siblings, and
// nothing a symlink in the tree points to.
#include "util/file_tree.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "temp_directory.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

class FileTreeTest : public ::testing::Test {
  protected:
    TempDirectory temp_{"file-tree"};
    const fs::path& dir_ = temp_.path();
};

TEST_F(FileTreeTest, RemovesWideDeepAndClosedTreesButNotWhatSymlinksName) {
    const fs::path tree = dir_ / "tree";
    for (int i = 0; i < 2000; ++i) {
        fs::create_directories(tree / "wide" / ("d" + std::to_string(i)));
        std::ofstream(tree / "wide" / ("d" + std::to_string(i)) / "f") << i;
    }
    fs::path deep = tree / "deep";
    for (int i = 0; i < 200; ++i) deep /= "x";
    fs::create_directories(deep);
    fs::permissions(tree / "wide" / "d7", fs::perms::none);
    fs::permissions(tree / "deep" / "x", fs::perms::owner_read | fs::perms::owner_exec);
    std::ofstream(dir_ / "outside") << "keep me\n";
    fs::create_directory(dir_ / "outside-dir");
    std::ofstream(dir_ / "outside-dir" / "file") << "keep me too\n";
    fs::create_symlink(dir_ / "outside", tree / "link-to-file");
    fs::create_directory_symlink(dir_ / "outside-dir", tree / "wide" / "link-to-dir");

    remove_tree(tree.string());
    EXPECT_FALSE(fs::exists(fs::symlink_status(tree)));
    EXPECT_TRUE(fs::is_regular_file(dir_ / "outside"));
    EXPECT_TRUE(fs::is_regular_file(dir_ / "outside-dir" / "file"));
    remove_tree(tree.string());  // gone already: fine
}

}  // namespace
}  // namespace sqbox

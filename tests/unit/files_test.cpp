// for_each_directory_entry: every entry but "." and "..", a descriptor that *at calls can use,
// and false (errno set, nothing visited) where the directory cannot be listed.
#include "util/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "temp_directory.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

TEST(ForEachDirectoryEntry, VisitsEveryEntryButDotsWithAUsableDescriptor) {
    TempDirectory temp("files");
    std::ofstream(temp.path() / "file") << "x";
    fs::create_directory(temp.path() / "directory");
    fs::create_symlink("file", temp.path() / ".hidden-link");
    std::vector<std::string> names;
    std::vector<std::string> directories;
    ASSERT_TRUE(for_each_directory_entry(temp.path(), [&](int dir_fd, const std::string& name) {
        names.push_back(name);
        struct stat st {};
        ASSERT_EQ(::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW), 0) << name;
        if (S_ISDIR(st.st_mode)) directories.push_back(name);
    }));
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{".hidden-link", "directory", "file"}));
    EXPECT_EQ(directories, std::vector<std::string>{"directory"});
}

TEST(ForEachDirectoryEntry, SaysWhenItCannotList) {
    TempDirectory temp("files");
    bool visited = false;
    const auto visit = [&](int, const std::string&) { visited = true; };
    EXPECT_FALSE(for_each_directory_entry(temp.path() / "missing", visit));
    EXPECT_EQ(errno, ENOENT);
    std::ofstream(temp.path() / "file") << "x";
    EXPECT_FALSE(for_each_directory_entry(temp.path() / "file", visit));
    EXPECT_EQ(errno, ENOTDIR);
    EXPECT_FALSE(visited);
}

}  // namespace
}  // namespace sqbox

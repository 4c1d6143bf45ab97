// for_each_directory_entry: every entry but "." and "..", a descriptor that *at calls can use,
// and false (errno set, nothing visited) where the directory cannot be listed.
// read_bounded_regular_file: the whole file up to the bound, whatever size it says it has.
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
#include "util/errors.h"
#include "util/unique_fd.h"

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

std::string read_bounded(const fs::path& path, size_t max_bytes) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw Error("cannot open " + path.string());
    return read_bounded_regular_file(fd.get(), max_bytes, path.string());
}

TEST(ReadBoundedRegularFile, ReadsFilesUpToTheBoundAndRefusesLarger) {
    TempDirectory temp("files");
    const std::string small = "root:x:0:0:root:/root:/bin/sh\n";
    const std::string large(100000, 'x');  // past the first page's room: read in several steps
    std::ofstream(temp.path() / "small") << small;
    std::ofstream(temp.path() / "large") << large;
    std::ofstream(temp.path() / "empty");
    EXPECT_EQ(read_bounded(temp.path() / "small", 1024), small);
    EXPECT_EQ(read_bounded(temp.path() / "large", large.size()), large);
    EXPECT_EQ(read_bounded(temp.path() / "empty", 16), "");
    EXPECT_THROW(read_bounded(temp.path() / "large", large.size() - 1), Error);
    EXPECT_THROW(read_bounded(temp.path() / "small", small.size() - 1), Error);
}

TEST(ReadBoundedRegularFile, ReadsWhatAFileSayingSizeZeroHolds) {
    // /proc's files say 0 bytes and hold more.
    const std::string status = read_bounded("/proc/self/status", size_t{1} << 20);
    EXPECT_EQ(status.rfind("Name:", 0), 0U);
    EXPECT_NE(status.find("\nThreads:"), std::string::npos);
    EXPECT_THROW(read_bounded("/proc/self/status", 10), Error);
    // Longer than the first page's room, so read in growing steps, each continuing the last.
    const std::string smaps = read_bounded("/proc/self/smaps", size_t{16} << 20);
    EXPECT_GT(smaps.size(), 4096U);
    EXPECT_EQ(smaps.back(), '\n');
    EXPECT_EQ(smaps.find('\0'), std::string::npos);
}

TEST(ReadBoundedRegularFile, RefusesWhatIsNotARegularFile) {
    TempDirectory temp("files");
    EXPECT_THROW(read_bounded(temp.path(), 1024), Error);
}

}  // namespace
}  // namespace sqbox

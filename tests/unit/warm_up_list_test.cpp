#include "warm_up/warm_up_list.h"

#include "warm_up/list_store.h"
#include "warm_up/warm_up.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "temp_directory.h"
#include "util/errors.h"
#include "util/unique_fd.h"
#include "util/user_directories.h"

namespace sqbox {
namespace {

using Kind = WarmUpKind;
using namespace std::string_literals;

std::string list_bytes(const std::string& records) {
    return "sqbox-warm-up 1\n" + records;
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
}

// Sets an environment variable for one scope and restores it.
class ScopedVariable {
  public:
    ScopedVariable(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value == nullptr) {
            ::unsetenv(name);
        } else {
            ::setenv(name, value, 1);
        }
    }
    ~ScopedVariable() {
        if (old_) {
            ::setenv(name_, old_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    ScopedVariable(const ScopedVariable&) = delete;
    ScopedVariable& operator=(const ScopedVariable&) = delete;

  private:
    const char* name_;
    std::optional<std::string> old_;
};

TEST(WarmUpList, RoundTripsAnyNameAnImageCanHold) {
    const std::vector<WarmUpName> names = {
        {"/usr/lib/python3.11", Kind::kList},
        {"/etc/passwd", Kind::kRead},
        {"/no such\nname \xff\x01", Kind::kLookUp},
        {"/a/b/c", Kind::kLookUp},
    };
    const std::string bytes = encode_warm_up_list(names);
    EXPECT_TRUE(bytes.starts_with("sqbox-warm-up 1\n"));
    EXPECT_EQ(decode_warm_up_list(bytes), names);
    EXPECT_EQ(decode_warm_up_list(list_bytes("")), std::vector<WarmUpName>{});
}

TEST(WarmUpList, RefusesWhatSqboxDidNotWrite) {
    EXPECT_EQ(decode_warm_up_list(""), std::nullopt);
    EXPECT_EQ(decode_warm_up_list("sqbox-warm-up 2\nL/etc\0"s), std::nullopt);
    EXPECT_EQ(decode_warm_up_list("L/etc\0"s), std::nullopt);
    // A record cut short: sqbox never leaves a list file like that.
    EXPECT_EQ(decode_warm_up_list(list_bytes("L/etc\0R/etc/pass"s)), std::nullopt);
}

TEST(WarmUpList, SkipsRecordsThatAreNotPathsInTheImage) {
    const std::string records =
        "L/ok\0"s
        "Lrelative\0"s
        "L/a/../etc/shadow\0"s
        "L/a/./b\0"s
        "L/a//b\0"s
        "L/trailing/\0"s
        "L//\0"s
        "X/unknown-kind\0"s
        "\0"s
        "R/" +
        std::string(kMaxWarmUpPathBytes, 'x') + "\0"s + "D/ok/too\0"s;
    const std::vector<WarmUpName> expected = {{"/ok", Kind::kLookUp}, {"/ok/too", Kind::kList}};
    EXPECT_EQ(decode_warm_up_list(list_bytes(records)), expected);
    EXPECT_EQ(decode_warm_up_records(records), expected);
    // The root itself: `ls /` lists it.
    const std::vector<WarmUpName> root = {{"/", Kind::kList}};
    EXPECT_EQ(decode_warm_up_records("D/\0"s), root);
}

TEST(WarmUpList, AListHoldsEachPathOnce) {
    const std::string records = "L/etc\0R/etc/passwd\0L/etc\0L/etc/passwd\0D/etc\0"s;
    const std::vector<WarmUpName> expected = {{"/etc", Kind::kList}, {"/etc/passwd", Kind::kRead}};
    EXPECT_EQ(decode_warm_up_list(list_bytes(records)), expected);
}

TEST(WarmUpList, ServerRecordsDropOnlyARecordCutShort) {
    const std::string records = encode_warm_up_record({"/etc", Kind::kLookUp}) +
                                encode_warm_up_record({"/etc/passwd", Kind::kRead}) + "D/us";
    const std::vector<WarmUpName> expected = {{"/etc", Kind::kLookUp},
                                              {"/etc/passwd", Kind::kRead}};
    EXPECT_EQ(decode_warm_up_records(records), expected);
}

TEST(WarmUpList, KeepsAtMostTheLimit) {
    std::string records;
    for (size_t i = 0; i < kMaxWarmUpNames + 10; ++i) {
        records += encode_warm_up_record({"/f" + std::to_string(i), Kind::kLookUp});
    }
    std::optional<std::vector<WarmUpName>> names = decode_warm_up_list(list_bytes(records));
    ASSERT_TRUE(names);
    ASSERT_EQ(names->size(), kMaxWarmUpNames);
    EXPECT_EQ(names->back().path, "/f" + std::to_string(kMaxWarmUpNames - 1));

    std::vector<WarmUpName> many(kMaxWarmUpNames, {"/same", Kind::kLookUp});
    for (size_t i = 0; i < many.size(); ++i) many[i].path = "/k" + std::to_string(i);
    EXPECT_EQ(merge_warm_up_names(many, {{"/new", Kind::kRead}}).size(), kMaxWarmUpNames);
}

TEST(WarmUpList, MergeKeepsTheFirstOrderAndTheStrongerKind) {
    const std::vector<WarmUpName> known = {
        {"/etc", Kind::kLookUp}, {"/etc/passwd", Kind::kLookUp}, {"/usr", Kind::kList}};
    const std::vector<WarmUpName> learned = {{"/bin", Kind::kLookUp},
                                             {"/etc/passwd", Kind::kRead},
                                             {"/usr", Kind::kLookUp},
                                             {"/bin", Kind::kList},
                                             {"/etc", Kind::kLookUp}};
    const std::vector<WarmUpName> expected = {{"/etc", Kind::kLookUp},
                                              {"/etc/passwd", Kind::kRead},
                                              {"/usr", Kind::kList},
                                              {"/bin", Kind::kList}};
    EXPECT_EQ(merge_warm_up_names(known, learned), expected);
}

TEST(WarmUpList, DirectoryFollowsTheCallersSettings) {
    {
        ScopedVariable cache("SQBOX_CACHE_DIR", "/c");
        ScopedVariable xdg("XDG_CACHE_HOME", "/x");
        EXPECT_EQ(default_warm_up_directory(), "/c/warm-up");
    }
    {
        ScopedVariable cache("SQBOX_CACHE_DIR", nullptr);
        ScopedVariable xdg("XDG_CACHE_HOME", "/x");
        EXPECT_EQ(default_warm_up_directory(), "/x/sqbox/warm-up");
    }
    {
        // Relative values are ignored, as the XDG rules say.
        ScopedVariable cache("SQBOX_CACHE_DIR", "relative");
        ScopedVariable xdg("XDG_CACHE_HOME", "also/relative");
        ScopedVariable home("HOME", "/home/u");
        EXPECT_EQ(default_warm_up_directory(), "/home/u/.cache/sqbox/warm-up");
        EXPECT_EQ(sqbox_cache_directory(), "/home/u/.cache/sqbox");
    }
}

TEST(WarmUpList, NameComesFromBothEndsOfTheImageAndItsSize) {
    TempDirectory dir{"warm-up"};
    const std::string head = "hsqs" + std::string(70000, 'h');
    const std::string middle(300000, 'm');
    const std::string tail(70000, 't');
    write_bytes(dir.path() / "a", head + middle + tail);
    write_bytes(dir.path() / "copy", head + middle + tail);
    std::string other_head = head;
    other_head[40] = 1;  // another superblock (bytes_used, say)
    write_bytes(dir.path() / "b", other_head + middle + tail);
    std::string other_tail = tail;
    other_tail[other_tail.size() - 100] = 'x';  // other tables at the end
    write_bytes(dir.path() / "c", head + middle + other_tail);
    write_bytes(dir.path() / "d", head + middle + "m" + tail);
    std::string other_middle = middle;
    other_middle[1000] = 'x';  // not read: the key is not a content hash
    write_bytes(dir.path() / "e", head + other_middle + tail);
    write_bytes(dir.path() / "small", "hsqs small image");
    auto name = [&](const char* file) {
        UniqueFd fd(::open((dir.path() / file).c_str(), O_RDONLY | O_CLOEXEC));
        return warm_up_list_name(fd.get());
    };
    const std::string a = name("a");
    EXPECT_EQ(a.size(), 16U);
    EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_EQ(name("copy"), a);
    EXPECT_NE(name("b"), a);
    EXPECT_NE(name("c"), a);
    EXPECT_NE(name("d"), a);
    EXPECT_EQ(name("e"), a);
    EXPECT_EQ(name("small").size(), 16U);
}

TEST(WarmUpList, LearningAddsToTheListAndKeepsItPrivate) {
    TempDirectory dir{"warm-up"};
    const std::filesystem::path lists = dir.path() / "cache" / "warm-up";
    const std::string path = (lists / "0123").string();
    EXPECT_EQ(load_warm_up_list(path), std::vector<WarmUpName>{});  // none yet

    const std::vector<WarmUpName> first = {{"/etc", Kind::kLookUp}, {"/bin/sh", Kind::kRead}};
    SavedWarmUpList saved = add_to_warm_up_list(path, first);
    EXPECT_EQ(saved.names, 2U);
    EXPECT_EQ(saved.added, 2U);
    EXPECT_EQ(load_warm_up_list(path), first);
    saved = add_to_warm_up_list(path, {{"/etc", Kind::kList}, {"/usr", Kind::kLookUp}});
    EXPECT_EQ(saved.names, 3U);
    EXPECT_EQ(saved.added, 1U);
    const std::vector<WarmUpName> both = {
        {"/etc", Kind::kList}, {"/bin/sh", Kind::kRead}, {"/usr", Kind::kLookUp}};
    EXPECT_EQ(load_warm_up_list(path), both);

    struct stat info {};
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 07777, 0600U);
    ASSERT_EQ(::stat(lists.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 07777, 0700U);
    // The list and the lock, no temporary file.
    std::vector<std::string> entries;
    for (const auto& entry : std::filesystem::directory_iterator(lists)) {
        entries.push_back(entry.path().filename().string());
    }
    std::sort(entries.begin(), entries.end());
    EXPECT_EQ(entries, (std::vector<std::string>{".lock", "0123"}));

    // What is not a list is ignored when read, and replaced by learning.
    write_bytes(path, "not a list");
    EXPECT_EQ(load_warm_up_list(path), std::nullopt);
    saved = add_to_warm_up_list(path, first);
    EXPECT_EQ(saved.added, 2U);
    EXPECT_EQ(load_warm_up_list(path), first);
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/etc/passwd", path);
    EXPECT_EQ(load_warm_up_list(path), std::nullopt);
}

TEST(WarmUpList, OnlyAPrivateDirectoryHoldsLists) {
    TempDirectory dir{"warm-up"};
    const std::filesystem::path lists = dir.path() / "warm-up";
    const std::string path = (lists / "0123").string();
    add_to_warm_up_list(path, {{"/etc", Kind::kLookUp}});
    std::filesystem::permissions(lists, std::filesystem::perms::group_write,
                                 std::filesystem::perm_options::add);
    EXPECT_THROW(load_warm_up_list(path), Error);
    EXPECT_THROW(add_to_warm_up_list(path, {{"/usr", Kind::kLookUp}}), Error);
}

TEST(WarmUpList, FailedSaveLeavesNothingBehind) {
    TempDirectory dir{"warm-up"};
    // The list's directory cannot be created: a file is in the way.
    write_bytes(dir.path() / "blocked", "");
    EXPECT_THROW(add_to_warm_up_list((dir.path() / "blocked" / "list").string(), {}), Error);
    // The list's path is a directory: the rename fails, and the temporary file goes.
    std::filesystem::create_directories(dir.path() / "d" / "list" / "occupied");
    ::chmod((dir.path() / "d").c_str(), 0700);
    EXPECT_THROW(add_to_warm_up_list((dir.path() / "d" / "list").string(), {}), Error);
    std::vector<std::string> entries;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "d")) {
        entries.push_back(entry.path().filename().string());
    }
    std::sort(entries.begin(), entries.end());
    EXPECT_EQ(entries, (std::vector<std::string>{".lock", "list"}));
}

}  // namespace
}  // namespace sqbox

// The image server's record of a learning run, as the launcher reads it back.
#include "warm_up/learning_recorder.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "util/files.h"
#include "util/unique_fd.h"
#include "warm_up/warm_up_list.h"

namespace sqbox {
namespace {

std::vector<WarmUpName> read_back(int fd) {
    EXPECT_EQ(::lseek(fd, 0, SEEK_SET), 0);
    return decode_warm_up_records(read_all(fd, "the records"));
}

TEST(LearningRecorder, RecordsEachAccessInTheListsFormat) {
    UniqueFd records(::memfd_create("records", MFD_CLOEXEC));
    ASSERT_TRUE(records);
    LearningRecorder recorder(records.get());
    recorder.looked_up("/usr");
    recorder.first_read("/usr/bin/python3");
    recorder.first_listed("/usr/lib");
    const std::vector<WarmUpName> expected = {{"/usr", WarmUpKind::kLookUp},
                                              {"/usr/bin/python3", WarmUpKind::kRead},
                                              {"/usr/lib", WarmUpKind::kList}};
    EXPECT_EQ(read_back(records.get()), expected);
}

TEST(LearningRecorder, WritesNoPathAListWouldNotKeep) {
    UniqueFd records(::memfd_create("records", MFD_CLOEXEC));
    ASSERT_TRUE(records);
    LearningRecorder recorder(records.get());
    recorder.looked_up("");  // an inode whose path the server does not know
    recorder.first_read("/" + std::string(kMaxWarmUpPathBytes, 'a'));
    recorder.first_read("/etc/hosts");
    const std::vector<WarmUpName> expected = {{"/etc/hosts", WarmUpKind::kRead}};
    EXPECT_EQ(read_back(records.get()), expected);
}

TEST(LearningRecorder, StopsAtItsBound) {
    UniqueFd records(::memfd_create("records", MFD_CLOEXEC));
    ASSERT_TRUE(records);
    LearningRecorder recorder(records.get());
    for (size_t i = 0; i < 4 * kMaxWarmUpNames + 10; ++i) {
        recorder.looked_up("/n" + std::to_string(i));
    }
    EXPECT_EQ(read_back(records.get()).size(), 4 * kMaxWarmUpNames);
}

}  // namespace
}  // namespace sqbox

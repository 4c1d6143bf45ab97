// What init does with the launcher's word on which limits the sandbox's cgroup holds: those
// rlimits go (the cgroup bounds the whole sandbox), every other one stays.
#include <gtest/gtest.h>

#include "runtime/cgroups.h"

namespace sqbox {
namespace {

ResourceLimits all_limits() {
    ResourceLimits limits;
    limits.cpu_seconds = 60;
    return limits;
}

TEST(CgroupHandOver, OnlyTheLimitsTheCgroupHoldsAreDropped) {
    ResourceLimits both = all_limits();
    drop_limits_held_by_cgroup("memory pids ", both);
    EXPECT_FALSE(both.memory_bytes.has_value());
    EXPECT_FALSE(both.processes.has_value());
    EXPECT_EQ(both.cpu_seconds, 60U);
    EXPECT_EQ(both.file_size_bytes, all_limits().file_size_bytes);
    EXPECT_EQ(both.open_files, all_limits().open_files);

    ResourceLimits pids_only = all_limits();
    drop_limits_held_by_cgroup("pids", pids_only);
    EXPECT_EQ(pids_only.memory_bytes, all_limits().memory_bytes);
    EXPECT_FALSE(pids_only.processes.has_value());
}

TEST(CgroupHandOver, NoCgroupOrAnUnknownWordDropsNothing) {
    // sqbox serve sends an empty text: its server has already decided the rlimits.
    for (const char* held : {"", "   ", "memorypids", "Memory", "cpu", "memory,pids"}) {
        SCOPED_TRACE(held);
        ResourceLimits limits = all_limits();
        drop_limits_held_by_cgroup(held, limits);
        EXPECT_EQ(limits.memory_bytes, all_limits().memory_bytes);
        EXPECT_EQ(limits.processes, all_limits().processes);
    }
}

}  // namespace
}  // namespace sqbox

#include "runtime/image_mount_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace sqbox {
namespace {

// Outside a supervisor /image is no FUSE mount (or nothing at all): the statfs is answered at
// once, and an answered probe is never a stall, however it was answered.
TEST(ImageMountProbe, AnAnsweredProbeIsNoStallAndEndsNoServer) {
    bool ended = false;
    const auto started = std::chrono::steady_clock::now();
    EXPECT_FALSE(end_image_server_if_stalled([&] { ended = true; }));
    EXPECT_FALSE(ended);
    EXPECT_LT(std::chrono::steady_clock::now() - started, kStalledServerVerdict);
}

TEST(ImageMountProbe, IsReapedOnceAnswered) {
    ImageMountProbe probe;
    ASSERT_TRUE(probe.start());
    EXPECT_TRUE(probe.running());
    const auto deadline = std::chrono::steady_clock::now() + kStalledServerVerdict;
    while (!probe.answered()) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the probe was never answered";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_FALSE(probe.running());
}

}  // namespace
}  // namespace sqbox

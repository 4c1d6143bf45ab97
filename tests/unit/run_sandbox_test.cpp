// run_sandbox's checks of a configuration that come before any namespace exists.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "sqbox/sandbox.h"
#include "temp_directory.h"

namespace sqbox {
namespace {

// The payload resolves its working directory in the sandbox's root only. A library caller (the
// command line always makes it absolute) gets an error, not a directory of the host: the
// payload's process inherits one from sqbox until the root is ready.
TEST(RunSandbox, ARelativeWorkingDirectoryIsRefusedBeforeAnythingStarts) {
    TempDirectory rootfs("relative-workdir");
    std::filesystem::create_directories(rootfs.path() / "etc");
    for (const char* workdir : {"tmp", "../etc", ""}) {
        SCOPED_TRACE(workdir);
        SandboxConfig config;
        config.image = rootfs.path().string();
        config.command = {"/bin/true"};
        config.workdir = workdir;
        const RunResult result = run_sandbox(config);
        EXPECT_EQ(result.exit_status, 125);
        EXPECT_FALSE(result.payload_started);
        EXPECT_NE(result.error.find("absolute path"), std::string::npos) << result.error;
    }
}

}  // namespace
}  // namespace sqbox

// The fuzz targets (tests/fuzz) run in the default build, without libFuzzer: on every input a
// fuzzer found a crash with (tests/fuzz/regressions/TARGET/, kept once the crash was fixed), and
// on the seed images tests/fuzz/make-seeds makes. A crash or a failed check aborts the test run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "temp_directory.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_input(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void run_all(const fuzz::Target& target, const fs::path& directory) {
    for (const auto& input : fs::directory_iterator(directory)) {
        if (!input.is_regular_file()) continue;
        SCOPED_TRACE(input.path().string());
        const std::vector<uint8_t> data = read_input(input.path());
        target.run(data.data(), data.size());
    }
}

TEST(FuzzRegressions, KeptCrashInputsRunCleanly) {
    const fs::path root = SQBOX_FUZZ_REGRESSIONS_DIR;
    size_t targets_with_inputs = 0;
    for (const fuzz::Target& target : fuzz::kTargets) {
        const fs::path directory = root / target.name;
        if (!fs::is_directory(directory)) continue;
        ++targets_with_inputs;
        run_all(target, directory);
    }
    EXPECT_GT(targets_with_inputs, 0U) << "no regression inputs under " << root;
}

TEST(FuzzRegressions, SeedImagesRunCleanly) {
    if (std::system("mksquashfs -version >/dev/null 2>&1") != 0) {
        GTEST_SKIP() << "mksquashfs (squashfs-tools) is not installed";
    }
    TempDirectory seeds("fuzz-seeds");
    const std::string command =
        std::string(SQBOX_FUZZ_SEED_SCRIPT) + " " + seeds.path().string() + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    size_t images = 0;
    for (const auto& entry : fs::directory_iterator(seeds.path()))
        images += entry.is_regular_file();
    ASSERT_GE(images, 8U);
    for (const fuzz::Target& target : fuzz::kTargets) {
        SCOPED_TRACE(target.name);
        run_all(target, seeds.path());
    }
}

}  // namespace
}  // namespace sqbox

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "cli/result_json.h"
#include "cli/run_command.h"
#include "runtime/rooted_path.h"
#include "util/errors.h"

namespace sqbox::cli {
namespace {

class TempDir {
  public:
    TempDir() {
        char pattern[] = "/tmp/sqbox-unit-XXXXXX";
        path_ = ::mkdtemp(pattern);
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    const std::string& path() const { return path_; }

  private:
    std::string path_;
};

TEST(MountOption, ParsesModesAndCanonicalisesTheSource) {
    TempDir dir;
    std::filesystem::create_directory(dir.path() + "/real");
    std::filesystem::create_directory_symlink(dir.path() + "/real", dir.path() + "/link");

    MountSpec ro = parse_mount_option(dir.path() + "/link:/work/./x/:ro");
    EXPECT_EQ(ro.source, std::filesystem::canonical(dir.path() + "/real").string());
    EXPECT_EQ(ro.destination, "/work/x");
    EXPECT_TRUE(ro.read_only);

    EXPECT_FALSE(parse_mount_option(dir.path() + ":/data").read_only);
    EXPECT_FALSE(parse_mount_option(dir.path() + ":/data:rw").read_only);
}

TEST(MountOption, RejectsBadValues) {
    TempDir dir;
    for (const std::string& bad :
         {std::string("nocolon"), dir.path() + "/missing:/x", dir.path() + ":relative",
          dir.path() + ":/x:rx", dir.path() + ":/a/../b", dir.path() + ":/", std::string(":/x")}) {
        EXPECT_THROW(parse_mount_option(bad), Error) << bad;
    }
}

TEST(RunOptions, ConvertsLimitsAndEnvironment) {
    ::setenv("SQBOX_UNIT_COPIED", "from-caller", 1);
    RunArguments args;
    args.image = "/nonexistent.sqsh";
    args.command = {"true"};
    args.env = {"A=1", "SQBOX_UNIT_COPIED", "B=x=y"};
    args.memory = "256M";
    args.timeout = "1.5";
    args.pids = "64";
    RunOptions options = build_run_options(args);
    EXPECT_EQ(options.config.limits.memory_bytes, 256ull << 20);
    EXPECT_EQ(options.config.limits.processes, 64u);
    EXPECT_DOUBLE_EQ(*options.config.timeout_seconds, 1.5);
    std::vector<std::pair<std::string, std::string>> expected = {
        {"A", "1"}, {"SQBOX_UNIT_COPIED", "from-caller"}, {"B", "x=y"}};
    EXPECT_EQ(options.config.environment, expected);
    EXPECT_EQ(options.config.outside_uid, ::geteuid());
}

TEST(RunOptions, RejectsBadValues) {
    RunArguments base;
    base.image = "/x.sqsh";
    base.command = {"true"};
    auto with = [&](auto change) {
        RunArguments args = base;
        change(args);
        return args;
    };
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.command.clear(); })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.timeout = "-1"; })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.timeout = "soon"; })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.workdir = "rel"; })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.env = {"1X=2"}; })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.pids = "0"; })), Error);
    EXPECT_THROW(build_run_options(with([](RunArguments& a) { a.tmpfs_size = "lots"; })), Error);
}

TEST(ResultJson, RendersEveryField) {
    RunResult result;
    result.exit_status = 137;
    result.signal = 9;
    result.payload_started = true;
    result.wall_ms = 12.5;
    result.peak_rss_bytes = 4096;
    std::string json = result_to_json(result);
    EXPECT_NE(json.find("\"exit_code\":137"), std::string::npos) << json;
    EXPECT_NE(json.find("\"signal\":9"), std::string::npos) << json;
    EXPECT_NE(json.find("\"payload_exit_code\":null"), std::string::npos) << json;
    EXPECT_NE(json.find("\"timed_out\":false"), std::string::npos) << json;
    EXPECT_NE(json.find("\"error\":null"), std::string::npos) << json;
    EXPECT_NE(json.find("\"peak_rss_bytes\":4096"), std::string::npos) << json;
}

TEST(PathComponents, NormalisesAndRejectsDotDot) {
    EXPECT_EQ(path_components("/a//b/./c/", "x"), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_TRUE(path_components("/", "x").empty());
    EXPECT_THROW(path_components("/a/../etc", "x"), Error);
}

}  // namespace
}  // namespace sqbox::cli

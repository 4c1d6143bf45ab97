// One table of inputs fed to every front end that accepts them: `sqbox run`'s options
// (build_run_options), a `sqbox serve` request (settings_from_request) and `enroot start`'s
// options (enroot_mount_option, enroot_env_option). Each must give the same answer, and the same
// error text after its own context (the option or field it names).
#include "config/config_validation.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "cli/enroot_command.h"
#include "cli/run_command.h"
#include "session/request_config.h"
#include "temp_directory.h"
#include "util/errors.h"

namespace sqbox {
namespace {

using nlohmann::ordered_json;

// What a front end made of an input: the config, or the text of the Error it threw.
using Outcome = std::variant<SandboxConfig, std::string>;

template <typename Build>
Outcome outcome_of(Build build) {
    try {
        return build();
    } catch (const Error& e) {
        return std::string(e.what());
    }
}

cli::RunArguments run_arguments() {
    cli::RunArguments args;
    args.image = "/nonexistent.sqsh";
    args.command = {"true"};
    return args;
}

Outcome run_outcome(const cli::RunArguments& args) {
    return outcome_of([&] { return cli::build_run_options(args).config; });
}

Outcome serve_outcome(ordered_json request) {
    request["command"] = {"true"};
    return outcome_of(
        [&] { return settings_from_request(request, SandboxConfig{}, false).config; });
}

// ---- mounts ----

struct MountCase {
    const char* name;
    std::string source;       // "DIR" stands for a fresh directory
    std::string destination;  // absolute: enroot reads a relative one as below the root
    // Accepted: the mount's canonical source ("DIR" likewise) and normalised destination.
    // Refused: `problem` is the text after each front end's context.
    std::string source_after;
    std::string destination_after;
    std::string problem;
};

std::string with_dir(std::string text, const std::string& dir) {
    if (text.rfind("DIR", 0) == 0) text.replace(0, 3, dir);
    return text;
}

const std::vector<MountCase>& mount_cases() {
    static const std::vector<MountCase> cases = {
        {"plain", "DIR", "/data", "DIR", "/data", ""},
        {"normalised destination", "DIR", "/work/./x//", "DIR", "/work/x", ""},
        {"symlinked source", "DIR/link", "/data", "DIR/real", "/data", ""},
        {"host dot-dot resolved", "DIR/real/..", "/data", "DIR", "/data", ""},
        {"dot-dot destination", "DIR", "/a/../b", "", "", "path /a/../b must not contain '..'"},
        {"dot-dot to the root", "DIR", "/x/..", "", "", "path /x/.. must not contain '..'"},
        {"dot-dot above the root", "DIR", "/../etc", "", "", "path /../etc must not contain '..'"},
        {"the root", "DIR", "/", "", "", "cannot mount over the sandbox's root"},
        {"the root, spelt long", "DIR", "//./", "", "", "cannot mount over the sandbox's root"},
        {"missing source", "DIR/missing", "/x", "", "", "DIR/missing: No such file or directory"},
    };
    return cases;
}

struct MountFrontEnd {
    const char* name;
    // The context its errors start with, for "SOURCE:DESTINATION".
    std::function<std::string(const std::string& source, const std::string& destination)> context;
    std::function<Outcome(const std::string& source, const std::string& destination)> build;
};

const std::vector<MountFrontEnd>& mount_front_ends() {
    static const std::vector<MountFrontEnd> front_ends = {
        {"sqbox run --mount",
         [](const std::string& s, const std::string& d) { return "--mount " + s + ":" + d; },
         [](const std::string& s, const std::string& d) {
             cli::RunArguments args = run_arguments();
             args.mounts = {s + ":" + d};
             return run_outcome(args);
         }},
        {"serve request mounts", [](const std::string&, const std::string&) { return "mounts"; },
         [](const std::string& s, const std::string& d) {
             return serve_outcome({{"mounts", {{{"source", s}, {"target", d}}}}});
         }},
        {"enroot start --mount",
         [](const std::string& s, const std::string& d) { return "--mount " + s + ":" + d; },
         [](const std::string& s, const std::string& d) {
             return outcome_of([&] {
                 SandboxConfig config;
                 if (auto mount = cli::enroot_mount_option(s + ":" + d)) {
                     config.mounts.push_back(*mount);
                 }
                 return config;
             });
         }},
    };
    return front_ends;
}

TEST(ConfigValidation, EveryFrontEndGivesAMountTheSameAnswer) {
    TempDirectory temp("validation");
    const std::string dir = std::filesystem::canonical(temp.path()).string();
    std::filesystem::create_directory(dir + "/real");
    std::filesystem::create_directory_symlink(dir + "/real", dir + "/link");

    for (const auto& test : mount_cases()) {
        const std::string source = with_dir(test.source, dir);
        for (const auto& front_end : mount_front_ends()) {
            SCOPED_TRACE(std::string(test.name) + " through " + front_end.name);
            Outcome outcome = front_end.build(source, test.destination);
            if (test.problem.empty()) {
                ASSERT_TRUE(std::holds_alternative<SandboxConfig>(outcome))
                    << std::get<std::string>(outcome);
                const auto& mounts = std::get<SandboxConfig>(outcome).mounts;
                ASSERT_EQ(mounts.size(), 1U);
                EXPECT_EQ(mounts[0].kind, MountSpec::Kind::kBind);
                EXPECT_EQ(mounts[0].source_in, MountSpec::SourceIn::kHost);
                EXPECT_EQ(mounts[0].source, with_dir(test.source_after, dir));
                EXPECT_EQ(mounts[0].destination, test.destination_after);
                EXPECT_FALSE(mounts[0].read_only);
            } else {
                ASSERT_TRUE(std::holds_alternative<std::string>(outcome));
                EXPECT_EQ(std::get<std::string>(outcome),
                          front_end.context(source, test.destination) + ": " +
                              with_dir(test.problem, dir));
            }
        }
    }
}

// What only some front ends can express, each in its own syntax.
TEST(ConfigValidation, SyntaxOfEachFrontEnd) {
    TempDirectory temp("validation");
    const std::string dir = temp.path().string();
    cli::RunArguments args = run_arguments();
    args.mounts = {":/x"};
    EXPECT_EQ(std::get<std::string>(run_outcome(args)), "--mount :/x: empty source path");
    EXPECT_EQ(
        std::get<std::string>(serve_outcome({{"mounts", {{{"source", ""}, {"target", "/x"}}}}})),
        "mounts: empty source path");
    args.mounts = {dir + ":relative"};
    EXPECT_EQ(std::get<std::string>(run_outcome(args)),
              "--mount " + dir + ":relative: relative must be an absolute path inside the sandbox");
    EXPECT_EQ(
        std::get<std::string>(serve_outcome({{"mounts", {{{"source", dir}, {"target", "rel"}}}}})),
        "mounts: rel must be an absolute path inside the sandbox");
    // enroot's fstab dialect: a target is relative to the container's root, with or without "/".
    EXPECT_EQ(cli::enroot_mount_option(dir + ":relative/./x")->destination, "/relative/x");
    EXPECT_THROW((void)cli::enroot_mount_option(dir + ":a/../b"), Error);
}

// `unlimited` output is for a caller that takes the output itself; sqbox serve holds a request's
// output until it answers, so a request must name a size.
TEST(ConfigValidation, UnlimitedOutputOnlyWhereTheCallerTakesIt) {
    cli::RunArguments args = run_arguments();
    Outcome by_default = run_outcome(args);
    ASSERT_TRUE(std::holds_alternative<SandboxConfig>(by_default));
    EXPECT_EQ(std::get<SandboxConfig>(by_default).output_limit_bytes, kDefaultOutputLimit);
    args.output_limit = "unlimited";
    Outcome lifted = run_outcome(args);
    ASSERT_TRUE(std::holds_alternative<SandboxConfig>(lifted));
    EXPECT_EQ(std::get<SandboxConfig>(lifted).output_limit_bytes, std::nullopt);
    EXPECT_EQ(std::get<std::string>(serve_outcome({{"output_limit", "unlimited"}})),
              "invalid value 'unlimited' for output_limit: expected a size such as 4096, 64k, "
              "512M or 1G");
}

// ---- sizes, counts, limits, times, paths and names ----

struct Setting {
    const char* run_option;  // "--memory"
    const char* field;       // the serve request's field
    std::function<void(cli::RunArguments&, const std::string&)> set;
    std::function<std::string(const SandboxConfig&)> read;  // the value, as text
};

template <typename T>
std::string text_of(const std::optional<T>& value) {
    if (!value) return "unlimited";
    std::ostringstream out;
    out << *value;
    return out.str();
}

const std::map<std::string, Setting>& settings() {
    static const std::map<std::string, Setting> table = {
        {"memory",
         {"--memory", "memory", [](auto& a, const auto& v) { a.memory = v; },
          [](const SandboxConfig& c) { return text_of(c.limits.memory_bytes); }}},
        {"pids",
         {"--pids", "pids", [](auto& a, const auto& v) { a.pids = v; },
          [](const SandboxConfig& c) { return text_of(c.limits.processes); }}},
        {"cpu_time",
         {"--cpu-time", "cpu_time", [](auto& a, const auto& v) { a.cpu_time = v; },
          [](const SandboxConfig& c) { return text_of(c.limits.cpu_seconds); }}},
        {"timeout",
         {"--timeout", "timeout", [](auto& a, const auto& v) { a.timeout = v; },
          [](const SandboxConfig& c) { return text_of(c.timeout_seconds); }}},
        {"output_limit",
         {"--output-limit", "output_limit", [](auto& a, const auto& v) { a.output_limit = v; },
          [](const SandboxConfig& c) { return text_of(c.output_limit_bytes); }}},
        {"workdir",
         {"--workdir", "workdir", [](auto& a, const auto& v) { a.workdir = v; },
          [](const SandboxConfig& c) { return c.workdir; }}},
    };
    return table;
}

struct SettingCase {
    const char* setting;
    // The value as `sqbox run` takes it; a serve request carries it as a JSON number when it is
    // one, else as a string.
    std::string text;
    // "=VALUE" for the value read back, else the error text after "invalid value 'TEXT' for
    // OPTION: " (for sizes and times) or after "OPTION: " (for paths).
    std::string expected;
};

const std::vector<SettingCase>& setting_cases() {
    static const std::string size = "expected a size such as 4096, 64k, 512M or 1G";
    static const std::string whole = "expected a positive whole number";
    static const std::string seconds = "expected a positive number of seconds, at most a week";
    static const std::vector<SettingCase> cases = {
        {"memory", "512M", "=536870912"},
        {"memory", "268435456", "=268435456"},
        {"memory", "unlimited", "=unlimited"},
        {"memory", "lots", size},
        {"memory", "-1", size},
        {"memory", "1.5", size},
        {"memory", "0", "expected a size greater than zero"},
        {"pids", "64", "=64"},
        {"pids", "unlimited", "=unlimited"},
        {"pids", "-3", whole},
        {"pids", "0", whole},
        {"pids", "2.5", whole},
        {"cpu_time", "5", "=5"},
        {"cpu_time", "1.5", whole},
        {"cpu_time", "0", whole},
        {"timeout", "1.5", "=1.5"},
        {"timeout", "604800", "=604800"},
        {"timeout", "604801", seconds},
        {"timeout", "0", seconds},
        {"timeout", "-2", seconds},
        {"output_limit", "0", "=0"},
        {"output_limit", "1K", "=1024"},
        {"output_limit", "many", size},
        {"workdir", "/tmp/./x/", "=/tmp/x"},
        {"workdir", "//", "=/"},
        {"workdir", "/a/../b", "path /a/../b must not contain '..'"},
        {"workdir", "relative", "relative must be an absolute path inside the sandbox"},
        {"workdir", "", "empty path must be an absolute path inside the sandbox"},
    };
    return cases;
}

ordered_json request_value(const std::string& text) {
    const auto number = ordered_json::parse(text, nullptr, false);
    return number.is_number() ? number : ordered_json(text);
}

std::string expected_error(const SettingCase& test, const std::string& option,
                           const std::string& shown) {
    if (std::string(test.setting) == "workdir") return option + ": " + test.expected;
    return "invalid value '" + shown + "' for " + option + ": " + test.expected;
}

TEST(ConfigValidation, RunAndServeGiveASettingTheSameAnswer) {
    for (const auto& test : setting_cases()) {
        const Setting& setting = settings().at(test.setting);
        const ordered_json value = request_value(test.text);
        cli::RunArguments args = run_arguments();
        setting.set(args, test.text);
        struct Result {
            const char* front_end;
            Outcome outcome;
            std::string option;
            std::string shown;  // the value as the error shows it
        };
        const Result results[] = {
            {"sqbox run", run_outcome(args), setting.run_option, test.text},
            {"serve request", serve_outcome({{setting.field, value}}), setting.field,
             value.is_string() ? value.get<std::string>() : value.dump()},
        };
        for (const auto& result : results) {
            SCOPED_TRACE(std::string(test.setting) + " '" + test.text + "' through " +
                         result.front_end);
            if (test.expected.front() == '=') {
                ASSERT_TRUE(std::holds_alternative<SandboxConfig>(result.outcome))
                    << std::get<std::string>(result.outcome);
                EXPECT_EQ(setting.read(std::get<SandboxConfig>(result.outcome)),
                          test.expected.substr(1));
            } else {
                ASSERT_TRUE(std::holds_alternative<std::string>(result.outcome));
                EXPECT_EQ(std::get<std::string>(result.outcome),
                          expected_error(test, result.option, result.shown));
            }
        }
    }
}

TEST(ConfigValidation, EveryFrontEndGivesAVariableNameTheSameAnswer) {
    for (const std::string name : {"PATH", "_x1", "1BAD", "A-B", ""}) {
        SCOPED_TRACE(name);
        const bool valid = name == "PATH" || name == "_x1";
        cli::RunArguments args = run_arguments();
        args.env = {name + "=v"};
        Outcome run = run_outcome(args);
        Outcome serve = serve_outcome({{"env", {{name, "v"}}}});
        Outcome enroot = outcome_of([&] {
            SandboxConfig config;
            config.environment.push_back(cli::enroot_env_option(name + "=v"));
            return config;
        });
        if (valid) {
            const std::vector<std::pair<std::string, std::string>> expected = {{name, "v"}};
            for (const Outcome* outcome : {&run, &serve, &enroot}) {
                ASSERT_TRUE(std::holds_alternative<SandboxConfig>(*outcome));
                EXPECT_EQ(std::get<SandboxConfig>(*outcome).environment, expected);
            }
            continue;
        }
        const std::string problem = "invalid variable name '" + name + "'";
        EXPECT_EQ(std::get<std::string>(run), "--env " + name + "=v: " + problem);
        EXPECT_EQ(std::get<std::string>(serve), "env: " + problem);
        // enroot's own wording, as enroot says it (test_enroot.py holds it to that).
        EXPECT_EQ(std::get<std::string>(enroot), "Invalid argument: " + name + "=v");
    }
}

// The enroot front end's own configuration (mounts.d, a configuration's mounts()) and an image's
// /etc/fstab go through the same rules as its --mount.
TEST(ConfigValidation, ImageFstabEntriesFollowTheSameRules) {
    EXPECT_THROW((void)cli::enroot_mount_option("tmpfs:/"), Error);
    try {
        (void)cli::enroot_mount_option("tmpfs:/a/../b");
        FAIL() << "accepted ..";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "--mount tmpfs:/a/../b: path /a/../b must not contain '..'");
    }
    // A propagation change of the root names it without mounting over it.
    EXPECT_FALSE(cli::enroot_mount_option("none:/:none:rprivate").has_value());
}

// 0 is a valid idle time (the sandbox serves its image itself): the message must not say
// "positive", and must say the bounds.
TEST(ConfigValidation, ImageServerIdleTakesZeroToADay) {
    EXPECT_EQ(validate::image_server_idle_seconds("0", "--image-server-idle"), 0U);
    EXPECT_EQ(validate::image_server_idle_seconds("86400", "--image-server-idle"), 86400U);
    for (const char* bad : {"-1", "", "1.5", "lots", "86401", "99999999999999999999", " 1"}) {
        try {
            (void)validate::image_server_idle_seconds(bad, "SQBOX_IMAGE_SERVER_IDLE");
            FAIL() << "accepted '" << bad << "'";
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()),
                      "invalid value '" + std::string(bad) +
                          "' for SQBOX_IMAGE_SERVER_IDLE: expected a whole number of seconds from "
                          "0 (the sandbox serves its image itself) to 86400 (a day)");
        }
    }
}

}  // namespace
}  // namespace sqbox

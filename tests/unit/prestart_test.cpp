// What sqbox serve and its pre-started interpreters agree on (src/session/prestart.h): the ready
// line that separates the imports' output from the request's, the request's frame, which requests
// an interpreter started before them can serve, and --preload's module names.
#include "session/prestart.h"

#include <gtest/gtest.h>

#include <string>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(PrestartReadiness, WaitsForTheReadyLineAndPassesOnWhatFollows) {
    PrestartReadiness readiness;
    EXPECT_EQ(readiness.take("sqbox-prestart-re"), "");
    EXPECT_FALSE(readiness.ready());
    EXPECT_EQ(readiness.take("ady 1234\nhello\n"), "hello\n");
    EXPECT_TRUE(readiness.ready());
    EXPECT_EQ(readiness.cpu_ns(), 1234U);
    // The request's own output, even one that looks like the line, is the request's.
    EXPECT_EQ(readiness.take("sqbox-prestart-ready 1\n"), "sqbox-prestart-ready 1\n");
    EXPECT_EQ(readiness.cpu_ns(), 1234U);
}

TEST(PrestartReadiness, DropsWhatTheImportsPrintedBeforeIt) {
    PrestartReadiness readiness;
    EXPECT_EQ(readiness.take("imported!\nno newline yet"), "");
    EXPECT_EQ(readiness.take("\nsqbox-prestart-ready 7\n"), "");
    EXPECT_TRUE(readiness.ready());
    EXPECT_EQ(readiness.cpu_ns(), 7U);
}

TEST(PrestartReadiness, ALineThatOnlyLooksLikeItIsNotIt) {
    PrestartReadiness readiness;
    EXPECT_EQ(readiness.take("sqbox-prestart-ready 12x\nsqbox-prestart-ready \n"), "");
    EXPECT_EQ(readiness.take(" sqbox-prestart-ready 3\n"), "");
    EXPECT_FALSE(readiness.ready());
    EXPECT_EQ(readiness.take(std::string(100000, 'x')), "");  // kept bounded meanwhile
    EXPECT_EQ(readiness.take("\nsqbox-prestart-ready 5\nout"), "out");
    EXPECT_EQ(readiness.cpu_ns(), 5U);
}

TEST(PrestartFrame, CarriesCodeWorkdirEnvironmentAndCpuLimit) {
    EXPECT_EQ(prestart_request_frame("print(1)", "/tmp", {{"A", "1"}, {"B", "x=y"}}, 5),
              std::string("8 4 10 5\nprint(1)/tmpA=1\0B=x=y\0", 31));
    EXPECT_EQ(prestart_request_frame("", "", {}, std::nullopt), "0 0 0 -\n");
}

TEST(PrestartCanServe, NotRequestsThatNeedTheirOwnSandboxOrStart) {
    EXPECT_TRUE(prestarted_can_serve(json{{"code", "1"}}));
    EXPECT_TRUE(
        prestarted_can_serve(json{{"code", "1"}, {"env", {{"TOKEN", "x"}}}, {"timeout", 3}}));
    EXPECT_FALSE(prestarted_can_serve(json{{"code", "1"}, {"memory", "1G"}}));
    EXPECT_FALSE(prestarted_can_serve(json{{"code", "1"}, {"pids", 5}}));
    EXPECT_FALSE(prestarted_can_serve(json{{"code", "1"}, {"mounts", json::array()}}));
    for (const char* name : {"PYTHONPATH", "PYTHONHASHSEED", "LC_ALL", "LANG", "HOME", "PATH"}) {
        EXPECT_FALSE(prestarted_can_serve(json{{"code", "1"}, {"env", {{name, "x"}}}})) << name;
    }
}

TEST(PrestartPreload, TakesDottedModuleNamesOnly) {
    for (const char* name : {"json", "email.mime.text", "_decimal", "a1.b_2"}) {
        EXPECT_NO_THROW(check_preload_module(name)) << name;
    }
    for (const char* name : {"", ".json", "json.", "a..b", "1abc", "os; import x", "-c", "a b"}) {
        EXPECT_THROW(check_preload_module(name), Error) << name;
    }
}

TEST(PrestartCommand, RunsTheStubWithTheModulesAsArguments) {
    const auto command = prestart_command({"json", "decimal"});
    ASSERT_EQ(command.size(), 5U);
    EXPECT_EQ(command[0], "python3");
    EXPECT_EQ(command[1], "-c");
    // The stub, after the code both stubs share for running a request as `python3 -c` does.
    EXPECT_EQ(command[2], std::string(python_c_source()) + std::string(prestart_stub_source()));
    EXPECT_EQ(command[3], "json");
    EXPECT_EQ(command[4], "decimal");
}

}  // namespace
}  // namespace sqbox

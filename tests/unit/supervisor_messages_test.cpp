// The server's reading of its warm supervisor's messages (src/session/supervisor_messages.h):
// whatever arrives, it is a JSON object with fields of the right types, or an Error (the server
// then stops saying why), never a json::exception that would end the server uncaught.
#include "session/supervisor_messages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(SupervisorMessages, AReportAsTheSupervisorWritesItIsRead) {
    const json report = parse_supervisor_message(
        MessageTag::kReport,
        R"({"key":7,"exit_status":0,"payload_started":true,"payload_finished":true,)"
        R"("timed_out":false,"wait_status":0,"wall_ns":12,"cpu_ns":3,"max_rss_kib":100,)"
        R"("error":""})");
    EXPECT_EQ(report.at("key").get<uint64_t>(), 7U);
    EXPECT_EQ(parse_supervisor_message(MessageTag::kFailed, R"({"error":"no fuse"})")["error"],
              "no fuse");
    EXPECT_TRUE(parse_supervisor_message(MessageTag::kReady, "{}").is_object());
}

TEST(SupervisorMessages, MalformedMessagesThrowError) {
    const std::vector<std::string> reports = {
        "",
        "{",
        "not json",
        "[1]",
        "5",
        std::string(100000, '[') + std::string(100000, ']'),
        "{}",
        R"({"key":"7"})",
        R"({"key":-1})",
        R"({"key":1.5})",
        R"({"key":7,"exit_status":"0"})",
        R"({"key":7,"wait_status":null})",
        R"({"key":7,"payload_started":1})",
        R"({"key":7,"timed_out":"no"})",
        R"({"key":7,"wall_ns":1.5})",
        R"({"key":7,"error":{"message":"x"}})",
    };
    for (const auto& text : reports) {
        EXPECT_THROW(parse_supervisor_message(MessageTag::kReport, text), Error) << text;
    }
    for (const std::string text : {"{", R"({"error":5})", "[]"}) {
        EXPECT_THROW(parse_supervisor_message(MessageTag::kFailed, text), Error) << text;
    }
}

}  // namespace
}  // namespace sqbox

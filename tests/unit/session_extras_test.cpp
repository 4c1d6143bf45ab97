// What the server reads of directory transfers (src/session/session_extras.h).
#include "session/session_extras.h"

#include <gtest/gtest.h>

namespace sqbox {
namespace {

TEST(SessionExtras, Base64DecodedSizeCountsPadding) {
    EXPECT_EQ(base64_decoded_size(""), 0U);
    EXPECT_EQ(base64_decoded_size("AA=="), 1U);
    EXPECT_EQ(base64_decoded_size("AAA="), 2U);
    EXPECT_EQ(base64_decoded_size("AAAA"), 3U);
    EXPECT_EQ(base64_decoded_size("AAAAAA"), 4U);  // unpadded: an upper bound
    EXPECT_EQ(base64_decoded_size("="), 0U);
}

TEST(SessionExtras, ADownloadAnswerIsWithinTheBudgetOnlyWithDataThatFits) {
    const json answer = {{"ok", true}, {"data_b64", "AAAAAAAA"}};  // 6 bytes
    EXPECT_TRUE(download_answer_within_budget(answer, 0, 6));
    EXPECT_TRUE(download_answer_within_budget(answer, 4, 10));
    EXPECT_FALSE(download_answer_within_budget(answer, 5, 10));
    EXPECT_FALSE(download_answer_within_budget(answer, 11, 10));
    EXPECT_FALSE(download_answer_within_budget({{"ok", true}, {"data_b64", 5}}, 0, 10));
}

TEST(SessionExtras, RequestsAreCheckedAsTheyArePassedOn) {
    std::optional<double> timeout;
    EXPECT_THROW(session_extra_request(json{{"op", "upload"}, {"data_b64", ""}}, 10, 1, timeout),
                 Error);  // no path to start at
    EXPECT_THROW(session_extra_request(
                     json{{"op", "upload"}, {"path", "/w"}, {"offset", -1}, {"data_b64", ""}}, 10,
                     1, timeout),
                 Error);
    EXPECT_THROW(
        session_extra_request(json{{"op", "upload"}, {"path", "/w"}, {"data_b64", ""}, {"last", 1}},
                              10, 1, timeout),
        Error);
    EXPECT_THROW(session_extra_request(json{{"op", "shell"}, {"command", 5}}, 10, 1, timeout),
                 Error);
    EXPECT_THROW(session_extra_request(json{{"op", "shell"}, {"command", "x"}, {"program", "bash"}},
                                       10, 1, timeout),
                 json::exception);
    EXPECT_FALSE(timeout);
    const json shell = session_extra_request(
        json{{"op", "shell"}, {"command", "ls"}, {"timeout", 2}, {"program", {"sh", "-i"}}}, 10, 1,
        timeout);
    EXPECT_EQ(shell.dump(),
              R"({"op":"shell","command":"ls","output_limit":1,"program":["sh","-i"],)"
              R"("timeout":2.0})");
    EXPECT_EQ(timeout, 2.0);
}

}  // namespace
}  // namespace sqbox

// Streamed output events (src/session/output_events.h): characters are never split between
// text events, and what a capture keeps goes out once.
#include "session/output_events.h"

#include <gtest/gtest.h>

#include <string>

namespace sqbox {
namespace {

TEST(CompleteUtf8Prefix, HoldsBackOnlyAnUnfinishedCharacter) {
    EXPECT_EQ(complete_utf8_prefix(""), 0U);
    EXPECT_EQ(complete_utf8_prefix("abc"), 3U);
    EXPECT_EQ(complete_utf8_prefix("a\xc3\xa9"), 3U);          // é complete
    EXPECT_EQ(complete_utf8_prefix("a\xc3"), 1U);              // é begun
    EXPECT_EQ(complete_utf8_prefix("a\xe2\x82"), 1U);          // € lacks a byte
    EXPECT_EQ(complete_utf8_prefix("a\xe2\x82\xac"), 4U);      // € complete
    EXPECT_EQ(complete_utf8_prefix("a\xf0\x9f\x98"), 1U);      // an emoji lacks a byte
    EXPECT_EQ(complete_utf8_prefix("a\xf0\x9f\x98\x80"), 5U);  // ...and complete
    EXPECT_EQ(complete_utf8_prefix("a\xff"), 2U);              // invalid: never completed
    EXPECT_EQ(complete_utf8_prefix("a\x80\x80\x80\x80"), 5U);  // stray continuations
}

TEST(StreamedCapture, SendsEachKeptByteOnceAndWholeCharacters) {
    StreamedCapture streamed;
    std::string kept = "ab\xc3";
    EXPECT_EQ(streamed.next(kept, false, false), "ab");
    EXPECT_EQ(streamed.next(kept, false, false), "");
    kept += "\xa9z";
    EXPECT_EQ(streamed.next(kept, false, false), "\xc3\xa9z");
    kept += "\xe2";
    EXPECT_EQ(streamed.next(kept, false, true), "\xe2");  // ended: the rest goes as it is
}

TEST(StreamedCapture, BinaryStreamsAreNotCutAtCharacters) {
    StreamedCapture streamed;
    EXPECT_EQ(streamed.next("ab\xc3", true, false), "ab\xc3");
}

TEST(OutputEvent, TextOrBase64) {
    EXPECT_EQ(output_event(7, "stdout", "hi", false).dump(),
              R"({"id":7,"event":"output","stream":"stdout","data":"hi"})");
    EXPECT_EQ(output_event("x", "stderr", "hi", true).dump(),
              R"({"id":"x","event":"output","stream":"stderr","data_b64":"aGk="})");
}

}  // namespace
}  // namespace sqbox

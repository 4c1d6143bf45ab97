// The serve protocol's line format (src/session/protocol_lines.h): messages are JSON objects of
// bounded depth, one per line, and lines may arrive in any pieces.
#include "session/protocol_lines.h"

#include <gtest/gtest.h>

#include <string>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(ParseMessageTest, TakesObjectsOnly) {
    EXPECT_EQ(parse_message(R"({"op": "ping", "id": 1})").dump(), R"({"op":"ping","id":1})");
    EXPECT_THROW(parse_message("[1]"), Error);
    EXPECT_THROW(parse_message("\"text\""), Error);
    EXPECT_THROW(parse_message("{\"op\": "), Error);
    EXPECT_THROW(parse_message(""), Error);
}

TEST(ParseMessageTest, RefusesDeepNesting) {
    const auto nested = [](int depth) {
        return "{\"a\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
    };
    EXPECT_NO_THROW(parse_message(nested(64)));
    EXPECT_THROW(parse_message(nested(65)), Error);
}

TEST(DumpLineTest, OneLineWithInvalidUtf8Replaced) {
    EXPECT_EQ(dump_line(json{{"text", "a\nb\xff"}}), "{\"text\":\"a\\nb\xef\xbf\xbd\"}\n");
}

TEST(LineBufferTest, CutsLinesFromPieces) {
    LineBuffer buffer;
    std::string line;
    buffer.append("one\ntw");
    ASSERT_TRUE(buffer.next_line(line));
    EXPECT_EQ(line, "one");
    EXPECT_FALSE(buffer.next_line(line));
    EXPECT_EQ(buffer.compact(), 2U);
    buffer.append("o\n\nthree");
    ASSERT_TRUE(buffer.next_line(line));
    EXPECT_EQ(line, "two");
    ASSERT_TRUE(buffer.next_line(line));
    EXPECT_EQ(line, "");
    EXPECT_FALSE(buffer.next_line(line));
    EXPECT_EQ(buffer.compact(), 5U);
    buffer.append("\n");
    ASSERT_TRUE(buffer.next_line(line));
    EXPECT_EQ(line, "three");
    EXPECT_EQ(buffer.compact(), 0U);
}

TEST(LineBufferTest, ClearDropsTheUnfinishedLine) {
    LineBuffer buffer;
    std::string line;
    buffer.append("partial");
    EXPECT_EQ(buffer.compact(), 7U);
    buffer.clear();
    buffer.append("next\n");
    ASSERT_TRUE(buffer.next_line(line));
    EXPECT_EQ(line, "next");
}

}  // namespace
}  // namespace sqbox

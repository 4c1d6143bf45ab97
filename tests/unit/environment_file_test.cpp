#include "image/environment_file.h"

#include <gtest/gtest.h>

#include "util/errors.h"

namespace sqbox {
namespace {

std::optional<std::string> lookup(const std::string& name) {
    if (name == "HOME") return std::string("/root");
    if (name == "EMPTY") return std::string();
    return std::nullopt;
}

EnvironmentEntries parse(const std::string& text) {
    return parse_environment_file(text, "/etc/environment", lookup);
}

TEST(EnvironmentFile, ParsesPlainQuotedAndExportedLines) {
    auto entries = parse(
        "# comment\n"
        "\n"
        "PATH=/usr/bin:/bin\n"
        "  LANG=C.UTF-8  \n"
        "export EDITOR=vi\n"
        "GREETING=\"hello world\"\n"
        "LITERAL='$HOME stays'\n"
        "EMPTYVAL=\n");
    EnvironmentEntries expected = {{"PATH", "/usr/bin:/bin"},  {"LANG", "C.UTF-8"},
                                   {"EDITOR", "vi"},           {"GREETING", "hello world"},
                                   {"LITERAL", "$HOME stays"}, {"EMPTYVAL", ""}};
    EXPECT_EQ(entries, expected);
}

TEST(EnvironmentFile, SubstitutesVariables) {
    auto entries =
        parse("A=${HOME}/bin\nB=$HOME:x\nC=\"${UNSET}-$EMPTY-\"\nD=\\$HOME\nE=cost $5\n");
    EnvironmentEntries expected = {
        {"A", "/root/bin"}, {"B", "/root:x"}, {"C", "--"}, {"D", "$HOME"}, {"E", "cost $5"}};
    EXPECT_EQ(entries, expected);
}

TEST(EnvironmentFile, ReportsTheLineOfAMalformedEntry) {
    try {
        parse("A=1\n\nthis is not an assignment\n");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "/etc/environment line 3: expected KEY=VALUE");
    }
    EXPECT_THROW(parse("1BAD=x\n"), Error);
    EXPECT_THROW(parse("A=\"unterminated\n"), Error);
    EXPECT_THROW(parse("A=${oops\n"), Error);
    EXPECT_THROW(parse("A=${BAD-NAME}\n"), Error);
}

TEST(EnvironmentFile, ValidatesNames) {
    EXPECT_TRUE(is_valid_variable_name("PATH"));
    EXPECT_TRUE(is_valid_variable_name("_x1"));
    EXPECT_FALSE(is_valid_variable_name(""));
    EXPECT_FALSE(is_valid_variable_name("1A"));
    EXPECT_FALSE(is_valid_variable_name("A-B"));
}

}  // namespace
}  // namespace sqbox

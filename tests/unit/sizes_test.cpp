#include "util/sizes.h"

#include <gtest/gtest.h>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(ParseSize, AcceptsBinaryUnits) {
    EXPECT_EQ(parse_size("4096", "--x"), 4096u);
    EXPECT_EQ(parse_size("64k", "--x"), 64u * 1024);
    EXPECT_EQ(parse_size("512M", "--x"), 512u * 1024 * 1024);
    EXPECT_EQ(parse_size("1G", "--x"), 1024ull * 1024 * 1024);
    EXPECT_EQ(parse_size("1GiB", "--x"), 1024ull * 1024 * 1024);
    EXPECT_EQ(parse_size("2mb", "--x"), 2u * 1024 * 1024);
}

TEST(ParseSize, RejectsGarbage) {
    for (const char* bad : {"", "G", "1X", "1.5G", "-1", "0", "1Gx", "99999999999999999999"}) {
        EXPECT_THROW(parse_size(bad, "--x"), Error) << bad;
    }
}

}  // namespace
}  // namespace sqbox

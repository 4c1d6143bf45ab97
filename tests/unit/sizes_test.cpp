#include "util/sizes.h"

#include <gtest/gtest.h>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(Sizes, ParsesCpus) {
    EXPECT_DOUBLE_EQ(parse_cpus("0.5", "--cpus"), 0.5);
    EXPECT_DOUBLE_EQ(parse_cpus("2", "--cpus"), 2.0);
    try {
        (void)parse_cpus("2s", "--cpus");
        FAIL() << "accepted 2s";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(),
                     "invalid value '2s' for --cpus: expected a positive number of CPUs, such as "
                     "0.5 or 2");
    }
    EXPECT_THROW((void)parse_cpus("0", "--cpus"), Error);
}

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

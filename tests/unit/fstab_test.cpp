#include "image/fstab.h"

#include <gtest/gtest.h>

#include "image/fstab_mounts.h"
#include "util/errors.h"

namespace sqbox {
namespace {

std::optional<std::string> lookup(const std::string& name) {
    if (name == "HOME") return std::string("/home/me");
    if (name == "ENROOT_ROOTFS") return std::string(kRootfsMarker);
    return std::nullopt;
}

std::vector<FstabEntry> parse(const std::string& text) {
    return parse_fstab(text, "fstab", lookup);
}

std::string options_of(const FstabEntry& entry) {
    std::string joined;
    for (const auto& option : entry.options) joined += (joined.empty() ? "" : ",") + option;
    return joined;
}

TEST(Fstab, CompletesOmittedFieldsAsEnrootDoes) {
    auto entries = parse(
        "# comment\n"
        "\n"
        "tmpfs /tmp\n"
        "/src\n"
        "/src bind\n"
        "/src /dst\n"
        "/src /dst bind\n"
        "none /dst devpts\n"
        "/a /b none x-create=dir,bind,ro 0 -1\n");
    ASSERT_EQ(entries.size(), 7U);
    EXPECT_EQ(entries[0].type, "tmpfs");
    EXPECT_EQ(entries[0].target, "/tmp");
    EXPECT_EQ(entries[1].target, "/src");
    EXPECT_EQ(options_of(entries[1]), "rbind,x-create=auto");
    EXPECT_EQ(entries[2].target, "/src");
    EXPECT_EQ(options_of(entries[2]), "bind");
    EXPECT_EQ(options_of(entries[3]), "rbind,x-create=auto");
    EXPECT_EQ(entries[3].target, "/dst");
    EXPECT_EQ(options_of(entries[4]), "bind");
    EXPECT_EQ(entries[4].type, "none");
    EXPECT_EQ(entries[5].type, "devpts");
    EXPECT_EQ(entries[6].pass, -1);
    EXPECT_EQ(entries[6].origin, "fstab line 9");
}

TEST(Fstab, FreqStandsInForAMissingPassNumber) {
    EXPECT_EQ(parse("/a /b none bind 2\n")[0].pass, 2);
    EXPECT_EQ(parse("/a /b none bind 2 3\n")[0].pass, 3);
    EXPECT_EQ(parse("/a /b none bind x y\n")[0].pass, 0);
}

TEST(Fstab, SubstitutesOnlyBracedVariablesAndDecodesEscapes) {
    auto entries = parse("${HOME}/data /mnt/$HOME none bind\n/a\\040b /c\\011d none bind\n");
    EXPECT_EQ(entries[0].source, "/home/me/data");
    EXPECT_EQ(entries[0].target, "/mnt/$HOME");
    EXPECT_EQ(entries[1].source, "/a b");
    EXPECT_EQ(entries[1].target, "/c\td");
    EXPECT_EQ(parse("${UNSET}/x /y none bind\n")[0].source, "/x");
}

TEST(Fstab, ReportsTheLineOfABrokenEntry) {
    try {
        parse("/a /b\n/c /d none bind 0 0 extra\n");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "fstab line 2: more than 6 fields");
    }
}

TEST(Fstab, MountArgumentsAreColonSeparatedFields) {
    FstabEntry entry = parse_mount_argument("/host:/work");
    EXPECT_EQ(entry.source, "/host");
    EXPECT_EQ(entry.target, "/work");
    EXPECT_EQ(options_of(entry), "rbind,x-create=auto");
    entry = parse_mount_argument("/host:/work:none:x-create=dir,bind,ro");
    EXPECT_EQ(options_of(entry), "x-create=dir,bind,ro");
    EXPECT_EQ(parse_mount_argument("tmpfs:/scratch").type, "tmpfs");
    EXPECT_THROW(parse_mount_argument("a b:/c"), Error);
    EXPECT_THROW(parse_mount_argument("/a::/c"), Error);
    EXPECT_THROW(parse_mount_argument(""), Error);
}

TEST(FstabMounts, RootfsSourcesStayInsideTheSandbox) {
    auto entries = parse("${ENROOT_ROOTFS}/data /vol none x-create=dir,bind,rw\n");
    auto spec = mount_spec_from_fstab(entries[0], HostSources::kRefused);
    ASSERT_TRUE(spec);
    EXPECT_EQ(spec->kind, MountSpec::Kind::kBind);
    EXPECT_EQ(spec->source_in, MountSpec::SourceIn::kSandbox);
    EXPECT_EQ(spec->source, "/data");
    EXPECT_EQ(spec->destination, "/vol");
    EXPECT_EQ(spec->create, MountSpec::Create::kDirectory);
    EXPECT_FALSE(spec->recursive);
}

TEST(FstabMounts, AnImageMayNotNameHostPaths) {
    auto entries = parse("/etc /hostetc none bind\n");
    try {
        (void)mount_spec_from_fstab(entries[0], HostSources::kRefused);
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fstab line 1: refusing to mount host path /etc"),
                  std::string::npos);
    }
    auto allowed = mount_spec_from_fstab(entries[0], HostSources::kAllowed);
    ASSERT_TRUE(allowed);
    EXPECT_EQ(allowed->source_in, MountSpec::SourceIn::kHost);
    EXPECT_EQ(allowed->source, "/etc");
}

TEST(FstabMounts, TmpfsOptionsMoveDetachAndUnsupportedTypes) {
    auto tmpfs = mount_spec_from_fstab(parse("tmpfs /s tmpfs size=1m,mode=700,noexec\n")[0],
                                       HostSources::kRefused);
    ASSERT_TRUE(tmpfs);
    EXPECT_EQ(tmpfs->kind, MountSpec::Kind::kTmpfs);
    EXPECT_TRUE(tmpfs->no_exec);
    std::vector<std::pair<std::string, std::string>> expected = {{"size", "1m"}, {"mode", "700"}};
    EXPECT_EQ(tmpfs->filesystem_options, expected);

    auto detach = mount_spec_from_fstab(parse("none /mnt/x none x-detach,nofail\n")[0],
                                        HostSources::kRefused);
    ASSERT_TRUE(detach);
    EXPECT_EQ(detach->kind, MountSpec::Kind::kDetach);
    EXPECT_TRUE(detach->optional);
    // The image may not take sqbox's own mounts away; the user's configuration may.
    EXPECT_THROW(
        (void)mount_spec_from_fstab(parse("none /proc none x-detach\n")[0], HostSources::kRefused),
        Error);
    EXPECT_TRUE(
        mount_spec_from_fstab(parse("none /proc none x-detach\n")[0], HostSources::kAllowed));

    auto move = mount_spec_from_fstab(parse("${ENROOT_ROOTFS}/a /b none x-move\n")[0],
                                      HostSources::kRefused);
    ASSERT_TRUE(move);
    EXPECT_EQ(move->kind, MountSpec::Kind::kMove);
    EXPECT_EQ(move->source, "/a");

    EXPECT_FALSE(mount_spec_from_fstab(parse("none /x none rslave\n")[0], HostSources::kRefused));
    EXPECT_THROW((void)mount_spec_from_fstab(parse("proc /proc proc\n")[0], HostSources::kRefused),
                 Error);
    EXPECT_THROW(
        (void)mount_spec_from_fstab(parse("/a /b none bind,bogus\n")[0], HostSources::kAllowed),
        Error);
}

}  // namespace
}  // namespace sqbox

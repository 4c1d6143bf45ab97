#include "runtime/sandbox_user.h"

#include <gtest/gtest.h>

namespace sqbox {
namespace {

SandboxConfig caller(uid_t uid, gid_t gid, std::string user, std::string group) {
    SandboxConfig config;
    config.outside_uid = uid;
    config.outside_gid = gid;
    config.outside_user_name = std::move(user);
    config.outside_group_name = std::move(group);
    return config;
}

TEST(SandboxUser, IsTheCallerUnderTheCallersNamesWithHomeInTmp) {
    const SandboxUser user = sandbox_user(caller(1000, 1001, "alice", "staff"));
    EXPECT_EQ(user.uid, 1000U);
    EXPECT_EQ(user.gid, 1001U);
    EXPECT_EQ(user.name, "alice");
    EXPECT_EQ(user.group, "staff");
    EXPECT_EQ(user.home, "/tmp");
    EXPECT_EQ(user.shell, "/bin/sh");
}

TEST(SandboxUser, IsRootWithMapRootOrAsRoot) {
    SandboxConfig config = caller(1000, 1000, "alice", "alice");
    config.map_root = true;
    for (const SandboxConfig& root : {config, caller(0, 0, "root", "root")}) {
        const SandboxUser user = sandbox_user(root);
        EXPECT_EQ(user.uid, 0U);
        EXPECT_EQ(user.gid, 0U);
        EXPECT_EQ(user.name, "root");
        EXPECT_EQ(user.group, "root");
        EXPECT_EQ(user.home, "/root");
    }
}

TEST(SandboxUser, NamesThatCouldBreakALineOrMisleadFallBack) {
    for (const char* hostile :
         {"", "eve:x:0:0::/:/bin/sh", "eve\nroot:x:0:0::/:/bin/sh", "-eve", "1234", ".", "..",
          "a/b", "eve ", "name-that-is-longer-than-32-chars", "root", "e\xc3\xa9"}) {
        const SandboxUser user = sandbox_user(caller(1000, 1000, hostile, hostile));
        EXPECT_EQ(user.name, kFallbackUserName) << hostile;
        EXPECT_EQ(user.group, kFallbackUserName) << hostile;
        const std::string passwd = merged_passwd("", user);
        EXPECT_EQ(passwd.find("eve"), std::string::npos) << passwd;
    }
    EXPECT_TRUE(is_portable_account_name("a.b_c-1"));
    EXPECT_TRUE(is_portable_account_name("name-that-is-exactly-32-chars-ok"));
    // The group falls back to the user's own name.
    EXPECT_EQ(sandbox_user(caller(1000, 1000, "alice", "bad:group")).group, "alice");
}

TEST(SandboxUser, PasswdPutsTheUserFirstAndKeepsTheImagesOtherEntries) {
    const SandboxUser user = sandbox_user(caller(1000, 1000, "alice", "alice"));
    const std::string image =
        "root:x:0:0:root:/root:/bin/bash\n"
        "_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n"
        "alice:x:2000:2000::/home/alice:/bin/bash\n"
        "ubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n"
        "+@netgroup\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin";  // no final newline
    EXPECT_EQ(merged_passwd(image, user),
              "alice:x:1000:1000:alice:/tmp:/bin/sh\n"
              "root:x:0:0:root:/root:/bin/bash\n"
              "ubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n"
              "+@netgroup\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
}

TEST(SandboxUser, PasswdWithoutAnImageFileHasTheUserRootAndNobody) {
    const SandboxUser user = sandbox_user(caller(1000, 1000, "alice", "alice"));
    EXPECT_EQ(merged_passwd("", user),
              "alice:x:1000:1000:alice:/tmp:/bin/sh\n"
              "root:x:0:0:root:/root:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    EXPECT_EQ(merged_group("", user),
              "alice:x:1000:\n"
              "root:x:0:\n"
              "nogroup:x:65534:\n");
}

TEST(SandboxUser, RootUsesTheImagesRootEntryWhenThereIsOne) {
    SandboxConfig config = caller(1000, 1000, "alice", "alice");
    config.map_root = true;
    const SandboxUser root = sandbox_user(config);
    const std::string image =
        "toor:x:0:0:root:/var/root:/bin/zsh\n"
        "_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n"
        "nobody:x:65534:65534::/:/sbin/nologin\n";
    EXPECT_EQ(merged_passwd(image, root),
              "toor:x:0:0:root:/var/root:/bin/zsh\n"
              "nobody:x:65534:65534::/:/sbin/nologin\n");
    // Without one, root gets a generated entry first.
    EXPECT_EQ(merged_passwd("daemon:x:1:1::/:/bin/false\n", root),
              "root:x:0:0:root:/root:/bin/sh\n"
              "daemon:x:1:1::/:/bin/false\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    EXPECT_EQ(merged_group("root:x:0:admin\nstaff:x:50:\n", root),
              "root:x:0:admin\nstaff:x:50:\nnogroup:x:65534:\n");
}

TEST(SandboxUser, GroupReplacesTheImagesGroupOfTheSameName) {
    const SandboxUser user = sandbox_user(caller(1000, 100, "alice", "users"));
    EXPECT_EQ(merged_group("root:x:0:\nusers:x:100:bob\nnogroup:x:65534:\n", user),
              "users:x:100:\nroot:x:0:\nnogroup:x:65534:\n");
}

}  // namespace
}  // namespace sqbox

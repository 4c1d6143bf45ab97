#include "cli/enroot_settings.h"

#include <gtest/gtest.h>

namespace sqbox::cli {
namespace {

TEST(EnrootSettings, YesNoValuesFollowEnrootsRule) {
    for (const char* off : {"", "n", "no", "N", "No", "NO", "f", "false", "F", "False", "FALSE"}) {
        EXPECT_FALSE(enroot_flag(off)) << off;
    }
    EXPECT_FALSE(enroot_flag(nullptr));
    for (const char* on : {"y", "yes", "1", "true", "on", "0", "nope"}) {
        EXPECT_TRUE(enroot_flag(on)) << on;
    }
}

TEST(EnrootSettings, DirectivesOverrideTheEnvironment) {
    EnrootSettings settings;
    settings.apply(
        {{"ENROOT_REMAP_ROOT", "y"}, {"ENROOT_LOGIN_SHELL", "no"}, {"ENROOT_UNKNOWN", "y"}});
    EXPECT_TRUE(settings.remap_root);
    EXPECT_FALSE(settings.login_shell);
    EXPECT_FALSE(settings.rootfs_writable);
}

TEST(EnrootSettings, DataPathDefaultsUnderXdgDataHome) {
    ::setenv("HOME", "/home/someone", 1);
    ::unsetenv("ENROOT_DATA_PATH");
    ::setenv("XDG_DATA_HOME", "/xdg/data", 1);
    EXPECT_EQ(load_enroot_settings().data_path, "/xdg/data/enroot");
    ::unsetenv("XDG_DATA_HOME");
    EXPECT_EQ(load_enroot_settings().data_path, "/home/someone/.local/share/enroot");
    ::setenv("ENROOT_DATA_PATH", "/custom/store", 1);
    EXPECT_EQ(load_enroot_settings().data_path, "/custom/store");
    ::unsetenv("ENROOT_DATA_PATH");
}

}  // namespace
}  // namespace sqbox::cli

// SandboxConfig through JSON and back (how `sqbox serve` hands a request's configuration to its
// supervisor): every field survives. The field lists are complete by construction (config_json.h
// counts them against the structs); this checks that every field's value survives the trip.
#include <gtest/gtest.h>

#include "session/config_codec.h"
#include "sqbox/config_json.h"

namespace sqbox {
namespace {

// Every field differs from its default.
SandboxConfig config_with_every_field_set() {
    MountSpec mount;
    mount.kind = MountSpec::Kind::kTmpfs;
    mount.source_in = MountSpec::SourceIn::kSupervisor;
    mount.source = "/host/src";
    mount.destination = "/dst";
    mount.read_only = true;
    mount.no_exec = true;
    mount.recursive = false;
    mount.create = MountSpec::Create::kFile;
    mount.filesystem_options = {{"size", "1M"}, {"mode", "0700"}};
    mount.optional = true;
    mount.from_image = true;
    mount.pass = 3;
    mount.origin = "--mount a:b";

    SandboxConfig config;
    config.image = "/images/python.sqsh";
    config.command = {"python3", "-c", "print(1)"};
    config.mounts = {mount, MountSpec{}};
    config.image_fstab = false;
    config.environment = {{"A", "1"}, {"B", "x=y"}};
    config.substitution_environment = {{{"HOME", "/home/me"}}};
    config.workdir = "/work";
    config.workdir_optional = true;
    config.hostname = "box";
    config.map_root = true;
    config.read_only_root = true;
    config.persistent_layer = "/data/layer";
    config.tmpfs_size_bytes = 3 * kMiB;
    config.timeout_seconds = 2.5;
    config.limits.memory_bytes = std::nullopt;
    config.limits.processes = 7;
    config.limits.cpu_seconds = 9;
    config.limits.file_size_bytes = 12345;
    config.limits.open_files = 99;
    config.limits.cpus = 0.5;
    config.cgroup_parent = "/sys/fs/cgroup/x";
    config.seccomp_profile = "strict";
    config.output_limit_bytes = 0;
    config.tty = true;
    config.outside_uid = 1234;
    config.outside_gid = 5678;
    config.outside_user_name = "alice";
    config.outside_group_name = "staff";
    config.entrypoint = SandboxConfig::Entrypoint::kEnrootRc;
    config.rc_script = "exec \"$@\"\n";
    config.login_shell = false;
    config.export_image_path = "/out.sqsh";
    config.image_server_idle_seconds = 5;
    config.verbose = true;
    config.proc_view = SandboxConfig::ProcView::kOuter;
    config.zygote = true;
    return config;
}

TEST(ConfigCodec, EveryFieldIsSetInTheTestConfig) {
    const nlohmann::json set = config_to_json(config_with_every_field_set());
    const nlohmann::json defaults = config_to_json(SandboxConfig{});
    ASSERT_EQ(set.size(), field_count<SandboxConfig>());
    for (const auto& [name, value] : defaults.items()) {
        EXPECT_NE(set.at(name), value) << name << " has its default value in the test config";
    }
    const nlohmann::json& mount = set.at("mounts").at(0);
    ASSERT_EQ(mount.size(), field_count<MountSpec>());
    const nlohmann::json default_mount = MountSpec{};
    for (const auto& [name, value] : default_mount.items()) {
        EXPECT_NE(mount.at(name), value) << "mount field " << name;
    }
    ASSERT_EQ(set.at("limits").size(), field_count<ResourceLimits>());
    const nlohmann::json default_limits = limits_to_json(ResourceLimits{});
    for (const auto& [name, value] : default_limits.items()) {
        EXPECT_NE(set.at("limits").at(name), value) << "limit " << name;
    }
}

TEST(ConfigCodec, EveryFieldSurvivesTheRoundTrip) {
    const SandboxConfig config = config_with_every_field_set();
    EXPECT_EQ(config_from_json(config_to_json(config)), config);
    EXPECT_EQ(config_from_json(config_to_json(SandboxConfig{})), SandboxConfig{});
    // Through text, as it travels.
    EXPECT_EQ(config_from_json(nlohmann::json::parse(config_to_json(config).dump())), config);
    EXPECT_EQ(limits_from_json(limits_to_json(config.limits)), config.limits);
}

TEST(ConfigCodec, OptionalsAreNullOrTheValue) {
    SandboxConfig config;
    config.timeout_seconds = 1.5;
    const nlohmann::json json = config_to_json(config);
    EXPECT_EQ(json.at("timeout_seconds"), 1.5);
    EXPECT_EQ(json.at("output_limit_bytes"), kDefaultOutputLimit);
    EXPECT_TRUE(json.at("rc_script").is_null());
    EXPECT_TRUE(json.at("limits").at("cpus").is_null());
    EXPECT_EQ(json.at("limits").at("memory_bytes"), 4 * kGiB);
}

TEST(ConfigCodec, AMissingFieldIsAnError) {
    nlohmann::json json = config_to_json(SandboxConfig{});
    json.erase("image_server_idle_seconds");
    EXPECT_THROW((void)config_from_json(json), nlohmann::json::exception);
}

}  // namespace
}  // namespace sqbox

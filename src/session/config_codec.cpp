#include "session/config_codec.h"

#include <nlohmann/json.hpp>

namespace sqbox {
namespace {

using nlohmann::json;

template <typename T>
json optional_to_json(const std::optional<T>& value) {
    return value ? json(*value) : json(nullptr);
}

template <typename T>
std::optional<T> optional_from_json(const json& value) {
    if (value.is_null()) return std::nullopt;
    return value.get<T>();
}

json mount_to_json(const MountSpec& mount) {
    return {{"kind", static_cast<int>(mount.kind)},
            {"source_in", static_cast<int>(mount.source_in)},
            {"source", mount.source},
            {"destination", mount.destination},
            {"read_only", mount.read_only},
            {"no_exec", mount.no_exec},
            {"recursive", mount.recursive},
            {"create", static_cast<int>(mount.create)},
            {"filesystem_options", mount.filesystem_options},
            {"optional", mount.optional},
            {"from_image", mount.from_image},
            {"pass", mount.pass},
            {"origin", mount.origin}};
}

MountSpec mount_from_json(const json& value) {
    MountSpec mount;
    mount.kind = static_cast<MountSpec::Kind>(value.at("kind").get<int>());
    mount.source_in = static_cast<MountSpec::SourceIn>(value.at("source_in").get<int>());
    mount.source = value.at("source").get<std::string>();
    mount.destination = value.at("destination").get<std::string>();
    mount.read_only = value.at("read_only").get<bool>();
    mount.no_exec = value.at("no_exec").get<bool>();
    mount.recursive = value.at("recursive").get<bool>();
    mount.create = static_cast<MountSpec::Create>(value.at("create").get<int>());
    mount.filesystem_options =
        value.at("filesystem_options").get<std::vector<std::pair<std::string, std::string>>>();
    mount.optional = value.at("optional").get<bool>();
    mount.from_image = value.at("from_image").get<bool>();
    mount.pass = value.at("pass").get<int>();
    mount.origin = value.at("origin").get<std::string>();
    return mount;
}

}  // namespace

json limits_to_json(const ResourceLimits& limits) {
    return {{"memory_bytes", optional_to_json(limits.memory_bytes)},
            {"processes", optional_to_json(limits.processes)},
            {"cpu_seconds", optional_to_json(limits.cpu_seconds)},
            {"file_size_bytes", optional_to_json(limits.file_size_bytes)},
            {"open_files", optional_to_json(limits.open_files)},
            {"cpus", optional_to_json(limits.cpus)}};
}

ResourceLimits limits_from_json(const json& value) {
    ResourceLimits limits;
    limits.memory_bytes = optional_from_json<uint64_t>(value.at("memory_bytes"));
    limits.processes = optional_from_json<uint64_t>(value.at("processes"));
    limits.cpu_seconds = optional_from_json<uint64_t>(value.at("cpu_seconds"));
    limits.file_size_bytes = optional_from_json<uint64_t>(value.at("file_size_bytes"));
    limits.open_files = optional_from_json<uint64_t>(value.at("open_files"));
    limits.cpus = optional_from_json<double>(value.at("cpus"));
    return limits;
}

json config_to_json(const SandboxConfig& config) {
    json mounts = json::array();
    for (const auto& mount : config.mounts) mounts.push_back(mount_to_json(mount));
    return {{"image", config.image},
            {"command", config.command},
            {"mounts", mounts},
            {"image_fstab", config.image_fstab},
            {"environment", config.environment},
            {"substitution_environment", optional_to_json(config.substitution_environment)},
            {"workdir", config.workdir},
            {"workdir_optional", config.workdir_optional},
            {"hostname", config.hostname},
            {"map_root", config.map_root},
            {"read_only_root", config.read_only_root},
            {"persistent_layer", config.persistent_layer},
            {"tmpfs_size_bytes", config.tmpfs_size_bytes},
            {"timeout_seconds", optional_to_json(config.timeout_seconds)},
            {"limits", limits_to_json(config.limits)},
            {"cgroup_parent", config.cgroup_parent},
            {"seccomp_profile", config.seccomp_profile},
            {"output_limit_bytes", optional_to_json(config.output_limit_bytes)},
            {"tty", config.tty},
            {"outside_uid", config.outside_uid},
            {"outside_gid", config.outside_gid},
            {"entrypoint", static_cast<int>(config.entrypoint)},
            {"rc_script", optional_to_json(config.rc_script)},
            {"login_shell", config.login_shell},
            {"export_image_path", config.export_image_path},
            {"warm_up_directory", config.warm_up_directory},
            {"use_warm_up_list", config.use_warm_up_list},
            {"learn_warm_up", config.learn_warm_up},
            {"verbose", config.verbose}};
}

SandboxConfig config_from_json(const json& value) {
    using Environment = std::vector<std::pair<std::string, std::string>>;
    SandboxConfig config;
    config.image = value.at("image").get<std::string>();
    config.command = value.at("command").get<std::vector<std::string>>();
    for (const auto& mount : value.at("mounts")) config.mounts.push_back(mount_from_json(mount));
    config.image_fstab = value.at("image_fstab").get<bool>();
    config.environment = value.at("environment").get<Environment>();
    config.substitution_environment =
        optional_from_json<Environment>(value.at("substitution_environment"));
    config.workdir = value.at("workdir").get<std::string>();
    config.workdir_optional = value.at("workdir_optional").get<bool>();
    config.hostname = value.at("hostname").get<std::string>();
    config.map_root = value.at("map_root").get<bool>();
    config.read_only_root = value.at("read_only_root").get<bool>();
    config.persistent_layer = value.at("persistent_layer").get<std::string>();
    config.tmpfs_size_bytes = value.at("tmpfs_size_bytes").get<uint64_t>();
    config.timeout_seconds = optional_from_json<double>(value.at("timeout_seconds"));
    config.limits = limits_from_json(value.at("limits"));
    config.cgroup_parent = value.at("cgroup_parent").get<std::string>();
    config.seccomp_profile = value.at("seccomp_profile").get<std::string>();
    config.output_limit_bytes = optional_from_json<uint64_t>(value.at("output_limit_bytes"));
    config.tty = value.at("tty").get<bool>();
    config.outside_uid = value.at("outside_uid").get<uid_t>();
    config.outside_gid = value.at("outside_gid").get<gid_t>();
    config.entrypoint = static_cast<SandboxConfig::Entrypoint>(value.at("entrypoint").get<int>());
    config.rc_script = optional_from_json<std::string>(value.at("rc_script"));
    config.login_shell = value.at("login_shell").get<bool>();
    config.export_image_path = value.at("export_image_path").get<std::string>();
    config.warm_up_directory = value.at("warm_up_directory").get<std::string>();
    config.use_warm_up_list = value.at("use_warm_up_list").get<bool>();
    config.learn_warm_up = value.at("learn_warm_up").get<bool>();
    config.verbose = value.at("verbose").get<bool>();
    return config;
}

}  // namespace sqbox

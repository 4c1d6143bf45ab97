// SandboxConfig, MountSpec and ResourceLimits as JSON, field by field: one list per struct, kept
// beside the structs (config.h stays free of nlohmann). Every field is written, and reading
// requires every field, so the two ends of `sqbox serve`'s hand-over always agree. A field added
// to a struct but not to its list here stops the build (SQBOX_JSON_FIELDS counts both).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "sqbox/config.h"

NLOHMANN_JSON_NAMESPACE_BEGIN

// std::optional as the value or null (nlohmann 3.11 has no support of its own).
template <typename T>
struct adl_serializer<std::optional<T>> {
    template <typename Json>
    static void to_json(Json& out, const std::optional<T>& value) {
        if (value) {
            out = *value;
        } else {
            out = nullptr;
        }
    }
    template <typename Json>
    static void from_json(const Json& in, std::optional<T>& value) {
        if (in.is_null()) {
            value.reset();
        } else {
            value = in.template get<T>();
        }
    }
};

NLOHMANN_JSON_NAMESPACE_END

namespace sqbox {

namespace config_json_detail {

// Converts to any field type: T{AnyField{}...} compiles for as many of them as T has fields.
struct AnyField {
    template <typename T>
    operator T() const;  // NOLINT(google-explicit-constructor): only ever unevaluated
};

template <typename T, typename... Fields>
constexpr size_t field_count(Fields... fields) {
    if constexpr (requires { T{fields..., AnyField{}}; }) {
        return field_count<T>(fields..., AnyField{});
    } else {
        return sizeof...(Fields);
    }
}

// The number of names in "a, b, c".
constexpr size_t names_in(const char* list) {
    size_t count = 1;
    for (; *list != '\0'; ++list) count += *list == ',' ? 1 : 0;
    return count;
}

}  // namespace config_json_detail

// The number of fields of the aggregate T.
template <typename T>
constexpr size_t field_count() {
    return config_json_detail::field_count<T>();
}

// to_json and from_json of Type through the named fields, which must be all of Type's fields.
#define SQBOX_JSON_FIELDS(Type, ...)                                                         \
    NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Type, __VA_ARGS__)                                    \
    static_assert(                                                                           \
        ::sqbox::field_count<Type>() == ::sqbox::config_json_detail::names_in(#__VA_ARGS__), \
        "every field of " #Type " must be in its JSON list (config_json.h)")

// Enums travel as their numbers (nlohmann's default).
SQBOX_JSON_FIELDS(MountSpec, kind, source_in, source, destination, read_only, no_exec, recursive,
                  create, filesystem_options, optional, from_image, pass, origin);

SQBOX_JSON_FIELDS(ResourceLimits, memory_bytes, processes, cpu_seconds, file_size_bytes, open_files,
                  cpus);

SQBOX_JSON_FIELDS(SandboxConfig, image, command, mounts, image_fstab, environment,
                  substitution_environment, workdir, workdir_optional, hostname, map_root,
                  read_only_root, persistent_layer, tmpfs_size_bytes, timeout_seconds, limits,
                  cgroup_parent, seccomp_profile, output_limit_bytes, tty, outside_uid, outside_gid,
                  outside_user_name, outside_group_name, entrypoint, rc_script, login_shell,
                  export_image_path, image_server_idle_seconds, verbose, proc_view, zygote);

}  // namespace sqbox

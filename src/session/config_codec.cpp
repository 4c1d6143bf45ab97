#include "session/config_codec.h"

#include "sqbox/config_json.h"

namespace sqbox {

// The field lists live in sqbox/config_json.h, beside the structs.

nlohmann::json limits_to_json(const ResourceLimits& limits) {
    return limits;
}

ResourceLimits limits_from_json(const nlohmann::json& json) {
    return json.get<ResourceLimits>();
}

nlohmann::json config_to_json(const SandboxConfig& config) {
    return config;
}

SandboxConfig config_from_json(const nlohmann::json& json) {
    return json.get<SandboxConfig>();
}

}  // namespace sqbox

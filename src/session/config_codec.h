// SandboxConfig as JSON: how `sqbox serve` hands a request's configuration to its long-lived
// supervisor, which already exists when the request arrives (so nothing can be inherited).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "sqbox/config.h"

namespace sqbox {

nlohmann::json config_to_json(const SandboxConfig& config);
SandboxConfig config_from_json(const nlohmann::json& json);

nlohmann::json limits_to_json(const ResourceLimits& limits);
ResourceLimits limits_from_json(const nlohmann::json& json);

}  // namespace sqbox

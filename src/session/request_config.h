// What a `run` or `session_open` request of the serve protocol asks for (src/session/PROTOCOL.md),
// turned into a SandboxConfig on top of the server's defaults. Validation happens here, so a bad
// request is answered with one clear BadRequest and never reaches a sandbox.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "sqbox/config.h"

namespace sqbox {

struct RequestSettings {
    SandboxConfig config;
    std::string stdin_data;
    bool binary = false;  // output as base64
};

// `base` holds the server's defaults (image, ids, limits, profile). For a session, `command` and
// `code` are not allowed and the driver's command is filled in by the server.
RequestSettings settings_from_request(const nlohmann::ordered_json& request,
                                      const SandboxConfig& base, bool session);

std::string base64_encode(std::string_view data);
// Throws Error on anything that is not standard base64.
std::string base64_decode(std::string_view text, const std::string& what);

}  // namespace sqbox

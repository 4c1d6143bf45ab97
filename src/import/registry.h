// Pulling an image from a registry speaking the distribution v2 API (`docker://` URIs, enroot's
// syntax). Blobs land in a cache keyed by digest, each verified before it is used.
#pragma once

#include <filesystem>
#include <string>

#include "import/image_layers.h"

namespace sqbox {

struct RegistryOptions {
    std::string architecture;          // GOARCH name (amd64, arm64); empty: the host's
    std::filesystem::path cache_dir;   // blobs by digest (enroot: $ENROOT_CACHE_PATH)
    std::filesystem::path config_dir;  // enroot's $ENROOT_CONFIG_PATH (.credentials)
    bool allow_http = false;           // enroot: ENROOT_ALLOW_HTTP
    bool progress = false;             // a progress display (on a terminal)
};

// `uri`: docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]. Throws Error with one clear line.
ImageLayers pull_from_registry(const std::string& uri, const RegistryOptions& options);

// The manifest digest `uri` resolves to (enroot digest), without fetching layers.
std::string registry_digest(const std::string& uri, const RegistryOptions& options);

}  // namespace sqbox

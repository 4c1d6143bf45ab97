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
    // Transfers (see apply_enroot_transfer_settings for the ENROOT_* variables behind them).
    long connect_timeout = 30;            // seconds, 0: none
    long transfer_timeout = 0;            // seconds per request, 0: none
    long stall_timeout = 60;              // seconds without a byte before a transfer fails, 0: none
    int retries = 2;                      // further attempts after a transient failure
    int max_connections = 10;             // parallel downloads, 0: no limit
    std::filesystem::path docker_config;  // Docker's config.json; empty: docker_config_path()
};

// Sets the transfer fields from enroot's ENROOT_CONNECT_TIMEOUT, ENROOT_TRANSFER_TIMEOUT,
// ENROOT_TRANSFER_RETRIES and ENROOT_MAX_CONNECTIONS when they are set. Throws Error for a value
// that is not a non-negative integer.
void apply_enroot_transfer_settings(RegistryOptions& options);

// `uri`: docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]. Throws Error with one clear line.
ImageLayers pull_from_registry(const std::string& uri, const RegistryOptions& options);

// The manifest digest `uri` resolves to (enroot digest), without fetching layers.
std::string registry_digest(const std::string& uri, const RegistryOptions& options);

}  // namespace sqbox

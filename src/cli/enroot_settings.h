// enroot's configuration variables (ENROOT_*), read from the caller's environment with enroot's
// defaults and its rule for yes/no values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "sqbox/config.h"

namespace sqbox::cli {

struct EnrootSettings {
    std::string data_path;         // ENROOT_DATA_PATH, default $XDG_DATA_HOME/enroot
    std::string config_path;       // ENROOT_CONFIG_PATH, default $XDG_CONFIG_HOME/enroot
    bool rootfs_writable = false;  // ENROOT_ROOTFS_WRITABLE (start --rw)
    bool remap_root = false;       // ENROOT_REMAP_ROOT (start --root)
    bool login_shell = true;       // ENROOT_LOGIN_SHELL
    bool force_override = false;   // ENROOT_FORCE_OVERRIDE (create/remove/export --force)
    // sqbox's own, for harnesses that cannot pass options through enroot's command line:
    // SQBOX_OUTPUT_LIMIT (sqbox run --output-limit) and SQBOX_TMPFS_SIZE (--tmpfs-size).
    std::optional<uint64_t> output_limit = kDefaultOutputLimit;
    uint64_t writable_bytes = kDefaultWritableBytes;
    unsigned image_server_idle_seconds = kDefaultImageServerIdleSeconds;  // SQBOX_IMAGE_SERVER_IDLE

    // Applies `#ENROOT_NAME=value` directives (of a configuration script) on top.
    void apply(const std::map<std::string, std::string>& directives);
};

// enroot's rule: unset, empty, and n/no/N/No/NO/f/false/F/False/FALSE are off; anything else on.
bool enroot_flag(const char* value);

EnrootSettings load_enroot_settings();

}  // namespace sqbox::cli

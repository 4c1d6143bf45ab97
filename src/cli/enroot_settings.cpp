#include "cli/enroot_settings.h"

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "config/config_validation.h"
#include "util/errors.h"
#include "util/user_directories.h"

namespace sqbox::cli {
namespace {

bool flag_or(const char* name, bool fallback) {
    const char* value = std::getenv(name);
    return value == nullptr ? fallback : enroot_flag(value);
}

}  // namespace

bool enroot_flag(const char* value) {
    if (value == nullptr || *value == '\0') return false;
    static const std::regex off("no?|N[oO]?|[fF](alse)?|FALSE");
    return !std::regex_match(value, off);
}

void EnrootSettings::apply(const std::map<std::string, std::string>& directives) {
    for (const auto& [name, value] : directives) {
        if (name == "ENROOT_REMAP_ROOT") remap_root = enroot_flag(value.c_str());
        if (name == "ENROOT_ROOTFS_WRITABLE") rootfs_writable = enroot_flag(value.c_str());
        if (name == "ENROOT_LOGIN_SHELL") login_shell = enroot_flag(value.c_str());
    }
}

EnrootSettings load_enroot_settings() {
    EnrootSettings settings;
    const char* data = std::getenv("ENROOT_DATA_PATH");
    if (data != nullptr && *data != '\0') {
        settings.data_path = data;
    } else {
        settings.data_path =
            environment_or("XDG_DATA_HOME", home_directory("ENROOT_DATA_PATH") + "/.local/share") +
            "/enroot";
    }
    const char* config = std::getenv("ENROOT_CONFIG_PATH");
    settings.config_path =
        config != nullptr && *config != '\0'
            ? std::string(config)
            : environment_or("XDG_CONFIG_HOME", home_directory("ENROOT_CONFIG_PATH") + "/.config") +
                  "/enroot";
    std::error_code ec;
    settings.data_path =
        std::filesystem::absolute(settings.data_path, ec).lexically_normal().string();
    if (ec) throw Error("ENROOT_DATA_PATH " + settings.data_path + ": " + ec.message());
    settings.rootfs_writable = flag_or("ENROOT_ROOTFS_WRITABLE", false);
    settings.remap_root = flag_or("ENROOT_REMAP_ROOT", false);
    settings.login_shell = flag_or("ENROOT_LOGIN_SHELL", true);
    settings.force_override = flag_or("ENROOT_FORCE_OVERRIDE", false);
    if (const char* limit = std::getenv("SQBOX_OUTPUT_LIMIT"); limit != nullptr && *limit != 0) {
        settings.output_limit = validate::output_limit_or_unlimited(limit, "SQBOX_OUTPUT_LIMIT");
    }
    if (const char* size = std::getenv("SQBOX_TMPFS_SIZE"); size != nullptr && *size != 0) {
        settings.writable_bytes = validate::tmpfs_size(size, "SQBOX_TMPFS_SIZE");
    }
    if (const char* idle = std::getenv("SQBOX_IMAGE_SERVER_IDLE"); idle != nullptr && *idle != 0) {
        settings.image_server_idle_seconds =
            validate::image_server_idle_seconds(idle, "SQBOX_IMAGE_SERVER_IDLE");
    }
    return settings;
}

}  // namespace sqbox::cli

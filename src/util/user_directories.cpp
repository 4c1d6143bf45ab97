#include "util/user_directories.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>

#include "util/errors.h"

namespace sqbox {
namespace {

std::string absolute_variable(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && value[0] == '/' ? std::string(value) : std::string();
}

}  // namespace

std::string environment_or(const char* name, const std::string& fallback) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

std::string home_directory(const std::string& hint) {
    const char* home = std::getenv("HOME");
    if (home != nullptr && *home != '\0') return home;
    const passwd* entry = ::getpwuid(::geteuid());
    if (entry == nullptr || entry->pw_dir == nullptr || entry->pw_dir[0] == '\0') {
        throw Error("cannot find your home directory: set HOME or " + hint);
    }
    return entry->pw_dir;
}

std::string sqbox_cache_directory() {
    if (std::string own = absolute_variable("SQBOX_CACHE_DIR"); !own.empty()) return own;
    if (std::string xdg = absolute_variable("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/sqbox";
    try {
        const std::string home = home_directory("SQBOX_CACHE_DIR");
        return home.starts_with('/') ? home + "/.cache/sqbox" : std::string();
    } catch (const Error&) {
        return "";
    }
}

}  // namespace sqbox

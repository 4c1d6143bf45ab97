// Environment variable names, as the shell knows them: what the image's /etc/environment, --env
// and enroot's configuration may name.
#pragma once

#include <cctype>
#include <string_view>

namespace sqbox {

// A character of a name ([A-Za-z_], and after the first also [0-9]).
inline bool is_name_char(char c, bool first) {
    return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0 ||
           (!first && std::isdigit(static_cast<unsigned char>(c)) != 0);
}

// True for a valid variable name ([A-Za-z_][A-Za-z0-9_]*).
inline bool is_valid_variable_name(std::string_view name) {
    if (name.empty() || !is_name_char(name.front(), true)) return false;
    for (char c : name.substr(1)) {
        if (!is_name_char(c, false)) return false;
    }
    return true;
}

}  // namespace sqbox

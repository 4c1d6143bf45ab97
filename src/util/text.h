// Small text helpers shared by the readers of configuration-like files.
#pragma once

#include <cctype>
#include <string_view>

namespace sqbox {

// `text` without leading and trailing white space (isspace, in the C locale's sense).
inline std::string_view trim_space(std::string_view text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0) {
        text.remove_prefix(1);
    }
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) {
        text.remove_suffix(1);
    }
    return text;
}

}  // namespace sqbox

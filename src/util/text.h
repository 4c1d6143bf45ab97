// Small text helpers shared by the readers of configuration-like files.
#pragma once

#include <cctype>
#include <span>
#include <string>
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

// `text` with every control character (newlines and terminal escapes included) made a space:
// what sqbox prints quotes names an image, archive, engine or payload chose.
inline std::string blank_controls(std::string text) {
    for (char& c : text) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    }
    return text;
}

// `bytes` as lowercase hex digits, two per byte.
inline std::string hex_of(std::span<const unsigned char> bytes) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string text;
    text.reserve(2 * bytes.size());
    for (const unsigned char byte : bytes) {
        text += kHex[byte >> 4];
        text += kHex[byte & 0xf];
    }
    return text;
}

}  // namespace sqbox

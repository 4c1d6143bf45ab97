// Source lines of the values in a JSON text, so that messages about a document can point at the
// line a person has to fix (nlohmann::json keeps no positions once parsed).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

namespace sqbox {

// Maps the JSON pointer of every value ("" for the root, "/syscalls/3/names/0", ...) to the
// 1-based line where it starts. `text` must already be valid JSON (parse it first).
std::unordered_map<std::string, int> json_value_lines(std::string_view text);

// The line of byte offset `offset` in `text` (1-based).
int line_of_offset(std::string_view text, size_t offset);

}  // namespace sqbox

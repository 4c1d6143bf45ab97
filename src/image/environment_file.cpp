#include "image/environment_file.h"

#include <cctype>

#include "util/errors.h"
#include "util/text.h"

namespace sqbox {
namespace {

std::string substitute(std::string_view value, const VariableLookup& lookup,
                       const std::string& where) {
    std::string out;
    for (size_t i = 0; i < value.size(); ++i) {
        char c = value[i];
        if (c == '\\' && i + 1 < value.size() && value[i + 1] == '$') {
            out += '$';
            ++i;
            continue;
        }
        if (c != '$' || i + 1 >= value.size()) {
            out += c;
            continue;
        }
        std::string name;
        if (value[i + 1] == '{') {
            size_t close = value.find('}', i + 2);
            if (close == std::string_view::npos) throw Error(where + ": unterminated ${");
            name = std::string(value.substr(i + 2, close - i - 2));
            if (!is_valid_variable_name(name)) {
                throw Error(where + ": invalid variable reference ${" + name + "}");
            }
            i = close;
        } else if (is_name_char(value[i + 1], true)) {
            size_t end = i + 1;
            while (end < value.size() && is_name_char(value[end], false)) ++end;
            name = std::string(value.substr(i + 1, end - i - 1));
            i = end - 1;
        } else {
            out += c;
            continue;
        }
        if (auto found = lookup(name)) out += *found;
    }
    return out;
}

}  // namespace

std::string substitute_braced_variables(std::string_view line, const VariableLookup& lookup) {
    std::string out;
    size_t i = 0;
    while (i < line.size()) {
        if (line[i] == '$' && i + 1 < line.size() && line[i + 1] == '{') {
            size_t close = line.find('}', i + 2);
            if (close != std::string_view::npos) {
                std::string name(line.substr(i + 2, close - i - 2));
                if (is_valid_variable_name(name)) {
                    if (auto value = lookup(name)) out += *value;
                    i = close + 1;
                    continue;
                }
            }
        }
        out += line[i++];
    }
    return out;
}

EnvironmentEntries parse_environment_file(std::string_view content, const std::string& source_name,
                                          const VariableLookup& lookup) {
    EnvironmentEntries entries;
    size_t line_number = 0;
    while (!content.empty()) {
        size_t newline = content.find('\n');
        std::string_view raw = content.substr(0, newline);
        content.remove_prefix(newline == std::string_view::npos ? content.size() : newline + 1);
        ++line_number;

        std::string_view line = trim_space(raw);
        if (line.empty() || line.front() == '#') continue;
        const std::string where = source_name + " line " + std::to_string(line_number);
        if (line.substr(0, 7) == "export " || line.substr(0, 7) == "export\t") {
            line = trim_space(line.substr(7));
        }
        size_t equals = line.find('=');
        if (equals == std::string_view::npos) throw Error(where + ": expected KEY=VALUE");
        std::string_view key = line.substr(0, equals);
        if (!is_valid_variable_name(key)) {
            throw Error(where + ": invalid variable name '" + std::string(key) + "'");
        }
        std::string_view value = line.substr(equals + 1);
        std::string parsed;
        if (!value.empty() && (value.front() == '"' || value.front() == '\'')) {
            char quote = value.front();
            if (value.size() < 2 || value.back() != quote) {
                throw Error(where + ": unterminated " + (quote == '"' ? "double" : "single") +
                            " quote");
            }
            std::string_view inner = value.substr(1, value.size() - 2);
            parsed = quote == '\'' ? std::string(inner) : substitute(inner, lookup, where);
        } else {
            parsed = substitute(value, lookup, where);
        }
        entries.emplace_back(std::string(key), std::move(parsed));
    }
    return entries;
}

}  // namespace sqbox

#include "image/fstab.h"

#include <array>
#include <cctype>
#include <charconv>

#include "util/errors.h"

namespace sqbox {
namespace {

// Options enroot's mount helper knows by name; a field made of these (or holding a comma) is
// taken for the options field when fields before it were omitted.
constexpr std::array<std::string_view, 53> kKnownOptions = {
    "async",        "atime",         "bind",          "dev",     "diratime",
    "dirsync",      "exec",          "iversion",      "loud",    "mand",
    "noatime",      "nodev",         "nodiratime",    "noexec",  "noiversion",
    "nomand",       "norelatime",    "nostrictatime", "nosuid",  "private",
    "rbind",        "relatime",      "remount",       "ro",      "rprivate",
    "rshared",      "rslave",        "runbindable",   "rw",      "shared",
    "silent",       "slave",         "strictatime",   "suid",    "sync",
    "unbindable",   "lazytime",      "nolazytime",    "auto",    "defaults",
    "group",        "noauto",        "nofail",        "nogroup", "noowner",
    "nouser",       "nousers",       "owner",         "user",    "users",
    "x-create=dir", "x-create=file", "x-create=auto",
};

bool looks_like_options(std::string_view field) {
    if (field.find(',') != std::string_view::npos) return true;
    if (field == "x-move" || field == "x-detach") return true;
    for (auto known : kKnownOptions) {
        if (field == known) return true;
    }
    return false;
}

// fstab(5) escapes: \040 space, \011 tab, \012 newline, \134 backslash.
std::string unescape(std::string_view field) {
    std::string out;
    for (size_t i = 0; i < field.size(); ++i) {
        if (field[i] == '\\' && i + 3 < field.size()) {
            std::string_view code = field.substr(i + 1, 3);
            if (code == "040" || code == "011" || code == "012" || code == "134") {
                out +=
                    static_cast<char>((code[0] - '0') * 64 + (code[1] - '0') * 8 + (code[2] - '0'));
                i += 3;
                continue;
            }
        }
        out += field[i];
    }
    return out;
}

int parse_number_field(std::string_view field) {
    int value = 0;
    // Like getmntent's sscanf("%d"): anything that is not a number counts as 0.
    (void)std::from_chars(field.data(), field.data() + field.size(), value);
    return value;
}

std::vector<std::string> split(std::string_view text, char separator) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = text.find(separator, start);
        if (end == std::string_view::npos) end = text.size();
        if (end > start) parts.emplace_back(text.substr(start, end - start));
        start = end + 1;
    }
    return parts;
}

// Completes a line whose trailing fields were omitted, with the guesses enroot makes:
//   tmpfs /dst      -> tmpfs /dst tmpfs ""
//   /src            -> /src  /src none  rbind,x-create=auto
//   /src bind       -> /src  /src none  bind
//   /src /dst       -> /src  /dst none  rbind,x-create=auto
//   /src /dst bind  -> /src  /dst none  bind
FstabEntry complete_entry(std::vector<std::string> fields, const std::string& origin) {
    fields.resize(std::max<size_t>(fields.size(), 6));
    std::string source = fields[0];
    std::string target = fields[1];
    std::string type = fields[2];
    std::string options = fields[3];
    int freq = parse_number_field(fields[4]);
    int pass = parse_number_field(fields[5]);
    if (freq != 0 && pass == 0) pass = freq;

    if (!target.empty() && type.empty() && options.empty() && looks_like_options(target)) {
        options = target;
        type = "none";
        target.clear();
    }
    if (!type.empty() && options.empty() && looks_like_options(type)) {
        options = type;
        type = "none";
        if (target == "none") target.clear();
    }
    if (!source.empty()) {
        if (source == "tmpfs") {
            if (type.empty() || type == "none") type = "tmpfs";
        } else {
            if (target.empty()) target = source;
            if (type.empty() || type == "none") {
                type = "none";
                if (options.empty()) options = "rbind,x-create=auto";
            }
        }
    }
    if (source.empty() || target.empty() || type.empty()) {
        throw Error(origin + ": incomplete mount entry (expected SOURCE TARGET [TYPE [OPTIONS]])");
    }
    FstabEntry entry;
    entry.source = std::move(source);
    entry.target = std::move(target);
    entry.type = std::move(type);
    entry.options = split(options, ',');
    entry.pass = pass;
    entry.origin = origin;
    return entry;
}

}  // namespace

bool FstabEntry::has_option(std::string_view name) const {
    for (const auto& option : options) {
        if (option == name) return true;
    }
    return false;
}

std::vector<FstabEntry> parse_fstab(std::string_view content, const std::string& origin_name,
                                    const VariableLookup& lookup) {
    std::vector<FstabEntry> entries;
    size_t line_number = 0;
    while (!content.empty()) {
        size_t newline = content.find('\n');
        std::string_view raw = content.substr(0, newline);
        content.remove_prefix(newline == std::string_view::npos ? content.size() : newline + 1);
        ++line_number;

        std::string line = substitute_braced_variables(raw, lookup);
        size_t first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos || line[first] == '#') continue;
        std::vector<std::string> fields;
        for (const auto& field : split(line, ' ')) {
            for (const auto& part : split(field, '\t')) {
                std::string cleaned = part;
                if (!cleaned.empty() && cleaned.back() == '\r') cleaned.pop_back();
                if (!cleaned.empty()) fields.push_back(unescape(cleaned));
            }
        }
        const std::string origin = origin_name + " line " + std::to_string(line_number);
        if (fields.size() > 6) throw Error(origin + ": more than 6 fields");
        entries.push_back(complete_entry(std::move(fields), origin));
    }
    return entries;
}

FstabEntry parse_mount_argument(const std::string& argument) {
    const std::string origin = "--mount " + argument;
    bool valid = !argument.empty() && argument.front() != ':' && argument.back() != ':' &&
                 argument.find("::") == std::string::npos;
    for (char c : argument) {
        if (std::isspace(static_cast<unsigned char>(c))) valid = false;
    }
    if (!valid) throw Error("Invalid argument: " + argument);
    std::vector<std::string> fields = split(argument, ':');
    if (fields.size() > 6) throw Error(origin + ": more than 6 fields");
    return complete_entry(std::move(fields), origin);
}

}  // namespace sqbox

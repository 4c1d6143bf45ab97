#include "import/enroot_image_files.h"

#include <cstdio>
#include <vector>

namespace sqbox {
namespace {

// enroot reads these with `jq -r ... | readarray -t`: a string holding a newline becomes
// several elements, as it does there.
std::vector<std::string> string_lines(const nlohmann::json& array) {
    std::vector<std::string> lines;
    if (!array.is_array()) return lines;
    for (const nlohmann::json& element : array) {
        std::string text;
        if (element.is_string()) {
            text = element.get<std::string>();
        } else if (!element.is_null()) {
            text = element.dump();  // jq -r prints other values as JSON
        } else {
            text = "null";
        }
        size_t start = 0;
        for (;;) {
            const size_t end = text.find('\n', start);
            lines.push_back(text.substr(start, end == std::string::npos ? end : end - start));
            if (end == std::string::npos) break;
            start = end + 1;
        }
    }
    return lines;
}

const nlohmann::json& member(const nlohmann::json& object, const char* name) {
    static const nlohmann::json kNull;
    if (!object.is_object()) return kNull;
    auto found = object.find(name);
    return found == object.end() ? kNull : *found;
}

std::string quoted_words(const std::vector<std::string>& words) {
    std::string text;
    for (const std::string& word : words) {
        if (!text.empty()) text += ' ';
        text += bash_quote(word);
    }
    return text;
}

}  // namespace

std::string bash_quote(const std::string& word) {
    bool control = false;
    for (unsigned char c : word) control = control || c < 0x20 || c == 0x7f;
    if (!control) {
        std::string quoted = "'";
        for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        return quoted + "'";
    }
    std::string quoted = "$'";
    for (unsigned char c : word) {
        switch (c) {
            case '\a':
                quoted += "\\a";
                break;
            case '\b':
                quoted += "\\b";
                break;
            case '\t':
                quoted += "\\t";
                break;
            case '\n':
                quoted += "\\n";
                break;
            case '\v':
                quoted += "\\v";
                break;
            case '\f':
                quoted += "\\f";
                break;
            case '\r':
                quoted += "\\r";
                break;
            case 0x1b:
                quoted += "\\E";
                break;
            case '\'':
                quoted += "\\'";
                break;
            case '\\':
                quoted += "\\\\";
                break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char octal[8];
                    std::snprintf(octal, sizeof octal, "\\%03o", c);
                    quoted += octal;
                } else {
                    quoted += static_cast<char>(c);
                }
        }
    }
    return quoted + "'";
}

EnrootImageFiles make_enroot_image_files(const nlohmann::json& config,
                                         const std::string& provenance) {
    const nlohmann::json& container = member(config, "config");
    EnrootImageFiles files;

    const nlohmann::json& volumes = member(container, "Volumes");
    if (volumes.is_object()) {
        for (const auto& [path, unused] : volumes.items()) {
            files.fstab += "${ENROOT_ROOTFS}" + path + " " + path +
                           " none x-create=dir,bind,rw,nosuid,nodev\n";
        }
    }
    for (const std::string& line : string_lines(member(container, "Env"))) {
        files.environment += line + "\n";
    }

    files.rc = "# enroot-provenance: " + provenance + "\n";
    const nlohmann::json& labels = member(container, "Labels");
    if (labels.is_object()) {
        for (const auto& [key, value] : labels.items()) {
            std::string text = value.is_string() ? value.get<std::string>() : value.dump();
            for (char& c : text) {
                if (c == '\n') c = ' ';
            }
            files.rc += "# " + key + " " + text + "\n";
        }
    }
    files.rc += "\n";

    std::vector<std::string> workdir_lines;
    const nlohmann::json& workdir = member(container, "WorkingDir");
    if (workdir.is_string()) workdir_lines = string_lines(nlohmann::json::array({workdir}));
    std::string directory = workdir_lines.empty() ? "" : workdir_lines.front();
    if (directory.empty()) directory = "/";
    files.working_directory = directory;

    std::vector<std::string> entrypoint = string_lines(member(container, "Entrypoint"));
    std::vector<std::string> command = string_lines(member(container, "Cmd"));
    if (entrypoint.empty() && command.empty()) command = {"/bin/sh"};

    files.rc += "mkdir -p \"" + directory + "\" 2> /dev/null\n";
    files.rc += "cd \"" + directory + "\" && unset OLDPWD || exit 1\n";
    files.rc += "\n";
    files.rc += "if [ -s /etc/rc.local ]; then\n";
    files.rc += "    . /etc/rc.local\n";
    files.rc += "fi\n";
    files.rc += "\n";
    files.rc += "if [ $# -gt 0 ]; then\n";
    files.rc += "    exec " + quoted_words(entrypoint) + " \"$@\"\n";
    files.rc += "else\n";
    files.rc += "    exec " + quoted_words(entrypoint) + " " + quoted_words(command) + "\n";
    files.rc += "fi\n";

    files.rc_local =
        "# This file is sourced by /etc/rc when the container starts.\n"
        "# It can be used to manipulate the entrypoint or the command of the container.\n";
    return files;
}

}  // namespace sqbox

#include "session/prestart.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "util/errors.h"

namespace sqbox {
namespace {

constexpr std::string_view kReadyPrefix = "sqbox-prestart-ready ";
// What is kept of output before the ready line while looking for it (an import may print).
constexpr size_t kMaxPendingBytes = 4096;

bool starts_with(std::string_view text, std::string_view prefix) {
    return text.substr(0, prefix.size()) == prefix;
}

bool read_at_start(std::string_view name) {
    constexpr std::array<std::string_view, 5> kExact = {"LANG", "LANGUAGE", "HOME", "PATH", "TZ"};
    return starts_with(name, "PYTHON") || starts_with(name, "LC_") ||
           std::find(kExact.begin(), kExact.end(), name) != kExact.end();
}

bool is_identifier_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool is_identifier_char(char c) {
    return is_identifier_start(c) || (c >= '0' && c <= '9');
}

}  // namespace

void check_preload_module(const std::string& name) {
    bool at_start = true;
    for (const char c : name) {
        if (c == '.' && !at_start) {
            at_start = true;
        } else if (at_start ? is_identifier_start(c) : is_identifier_char(c)) {
            at_start = false;
        } else {
            throw Error("--preload: '" + name + "' is not a Python module name");
        }
    }
    if (at_start) throw Error("--preload: '" + name + "' is not a Python module name");
}

std::string python_stub_program(std::string_view stub) {
    std::string program(python_c_source());
    program.append(stub);
    return program;
}

std::vector<std::string> prestart_command(const std::vector<std::string>& preload) {
    std::vector<std::string> command = {"python3", "-c",
                                        python_stub_program(prestart_stub_source())};
    command.insert(command.end(), preload.begin(), preload.end());
    return command;
}

bool prestarted_can_serve(const json& request) {
    if (request.contains("mounts") || request.contains("memory") || request.contains("pids")) {
        return false;
    }
    if (!request.contains("env")) return true;
    for (const auto& item : request.at("env").items()) {
        if (read_at_start(item.key())) return false;
    }
    return true;
}

std::string prestart_request_frame(
    std::string_view code, std::string_view workdir,
    const std::vector<std::pair<std::string, std::string>>& environment,
    std::optional<uint64_t> cpu_seconds) {
    std::string env;
    for (const auto& [key, value] : environment) {
        env += key;
        env += '=';
        env += value;
        env += '\0';
    }
    std::string frame = std::to_string(code.size()) + ' ' + std::to_string(workdir.size()) + ' ' +
                        std::to_string(env.size()) + ' ' +
                        (cpu_seconds ? std::to_string(*cpu_seconds) : std::string("-")) + '\n';
    frame.append(code);
    frame.append(workdir);
    frame += env;
    return frame;
}

std::string_view PrestartReadiness::take(std::string_view chunk) {
    if (ready()) return chunk;
    const size_t before = pending_.size();
    pending_.append(chunk);
    size_t line_start = 0;
    while (line_start < pending_.size()) {
        const size_t end = pending_.find('\n', line_start);
        if (end == std::string::npos) break;
        const std::string_view line(pending_.data() + line_start, end - line_start);
        uint64_t cpu_ns = 0;
        if (starts_with(line, kReadyPrefix)) {
            const std::string_view number = line.substr(kReadyPrefix.size());
            const auto [ptr, error] =
                std::from_chars(number.data(), number.data() + number.size(), cpu_ns);
            if (error == std::errc() && ptr == number.data() + number.size()) {
                cpu_ns_ = cpu_ns;
                // What follows the line came in this chunk (the pending part held no newline).
                return chunk.substr(end + 1 - before);
            }
        }
        line_start = end + 1;
    }
    pending_.erase(0, line_start);
    if (pending_.size() > kMaxPendingBytes) pending_.erase(0, pending_.size() - kMaxPendingBytes);
    return {};
}

}  // namespace sqbox

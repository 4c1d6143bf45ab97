#include "session/request_config.h"

#include <array>
#include <nlohmann/json.hpp>

#include "config/config_validation.h"
#include "util/errors.h"

namespace sqbox {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kBase64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The text of a size, count or time: a string as it is, anything else as JSON ("512", "1.5",
// "true"); the shared rules then accept or refuse it as they do `sqbox run`'s option.
std::string value_text(const json& value) {
    return value.is_string() ? value.get<std::string>() : value.dump();
}

MountSpec mount_from_request(const json& value) {
    if (!value.is_object()) throw Error("mounts: each mount is an object {source, target}");
    const std::string source = value.at("source").get<std::string>();
    MountSpec mount = validate::host_bind_mount(source, value.at("target").get<std::string>(),
                                                value.value("read_only", false), "mounts");
    mount.origin = "mount " + source;
    return mount;
}

}  // namespace

std::string base64_encode(std::string_view data) {
    std::string out;
    out.reserve((data.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 2 < data.size(); i += 3) {
        const auto n = (static_cast<uint32_t>(static_cast<unsigned char>(data[i])) << 16) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(data[i + 1])) << 8) |
                       static_cast<uint32_t>(static_cast<unsigned char>(data[i + 2]));
        for (int shift : {18, 12, 6, 0}) out += kBase64Alphabet[(n >> shift) & 63];
    }
    if (i < data.size()) {
        uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(data[i])) << 16;
        if (i + 1 < data.size()) {
            n |= static_cast<uint32_t>(static_cast<unsigned char>(data[i + 1])) << 8;
        }
        out += kBase64Alphabet[(n >> 18) & 63];
        out += kBase64Alphabet[(n >> 12) & 63];
        out += i + 1 < data.size() ? kBase64Alphabet[(n >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

std::string base64_decode(std::string_view text, const std::string& what) {
    std::array<int, 256> values{};
    values.fill(-1);
    for (size_t i = 0; i < kBase64Alphabet.size(); ++i) {
        values[static_cast<unsigned char>(kBase64Alphabet[i])] = static_cast<int>(i);
    }
    if (text.size() % 4 != 0) throw Error(what + ": not base64");
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        uint32_t n = 0;
        int padding = 0;
        for (size_t j = 0; j < 4; ++j) {
            const char c = text[i + j];
            if (c == '=' && i + 4 == text.size() && j >= 2) {
                ++padding;
                n <<= 6;
                continue;
            }
            const int value = values[static_cast<unsigned char>(c)];
            if (value < 0 || padding > 0) throw Error(what + ": not base64");
            n = (n << 6) | static_cast<uint32_t>(value);
        }
        out += static_cast<char>((n >> 16) & 0xff);
        if (padding < 2) out += static_cast<char>((n >> 8) & 0xff);
        if (padding < 1) out += static_cast<char>(n & 0xff);
    }
    return out;
}

RequestSettings settings_from_request(const json& request, const SandboxConfig& base,
                                      bool session) {
    RequestSettings settings;
    SandboxConfig& config = settings.config;
    config = base;
    try {
        if (request.value("network", false)) {
            throw Error("network: sandboxes have no network but their own loopback");
        }
        if (!session) {
            if (request.contains("command") == request.contains("code")) {
                throw Error("give either command (an argv list) or code (Python source)");
            }
            if (request.contains("command")) {
                config.command = request.at("command").get<std::vector<std::string>>();
                if (config.command.empty()) throw Error("command: must not be empty");
            } else {
                config.command = {"python3", "-c", request.at("code").get<std::string>()};
            }
        } else if (request.contains("command") || request.contains("code")) {
            throw Error("a session runs the interpreter; send code with exec");
        }
        if (request.contains("stdin")) settings.stdin_data = request.at("stdin").get<std::string>();
        if (request.contains("stdin_b64")) {
            settings.stdin_data =
                base64_decode(request.at("stdin_b64").get<std::string>(), "stdin_b64");
        }
        if (request.contains("env")) {
            for (const auto& [key, value] : request.at("env").items()) {
                validate::check_variable_name(key, "env");
                config.environment.emplace_back(key, value.get<std::string>());
            }
        }
        if (request.contains("mounts")) {
            for (const auto& mount : request.at("mounts")) {
                config.mounts.push_back(mount_from_request(mount));
            }
        }
        if (request.contains("workdir")) {
            config.workdir =
                validate::working_directory(request.at("workdir").get<std::string>(), "workdir");
        }
        if (request.contains("timeout")) {
            // A number of seconds: a string is not one, even "10" ("\"10\"" is refused).
            config.timeout_seconds =
                validate::timeout_seconds(request.at("timeout").dump(), "timeout");
        }
        if (request.contains("cpu_time")) {
            config.limits.cpu_seconds =
                validate::cpu_time_limit(request.at("cpu_time").dump(), "cpu_time");
        }
        if (request.contains("memory")) {
            config.limits.memory_bytes =
                validate::memory_limit(value_text(request.at("memory")), "memory");
        }
        if (request.contains("pids")) {
            config.limits.processes =
                validate::process_limit(value_text(request.at("pids")), "pids");
        }
        if (request.contains("output_limit")) {
            config.output_limit_bytes =
                validate::output_limit(value_text(request.at("output_limit")), "output_limit");
        }
        settings.binary = request.value("binary", false);
    } catch (const json::exception& e) {
        throw Error(std::string("malformed request: ") + e.what());
    }
    return settings;
}

}  // namespace sqbox

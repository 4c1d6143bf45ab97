#include "import/registry_credentials.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "import/docker_reference.h"
#include "util/errors.h"
#include "util/user_directories.h"

namespace sqbox {
namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

struct NetrcToken {
    std::string text;
    size_t start;  // offset in the input, to take the rest of a line
    size_t line_end;
};

std::vector<NetrcToken> netrc_tokens(const std::string& text) {
    std::vector<NetrcToken> tokens;
    size_t i = 0;
    while (i < text.size()) {
        if (is_space(text[i])) {
            ++i;
            continue;
        }
        if (text[i] == '#') {  // a comment runs to the end of the line
            while (i < text.size() && text[i] != '\n') ++i;
            continue;
        }
        NetrcToken token{"", i, text.find('\n', i)};
        if (token.line_end == std::string::npos) token.line_end = text.size();
        if (text[i] == '"') {
            for (++i; i < text.size() && text[i] != '"'; ++i) {
                if (text[i] == '\\' && i + 1 < text.size()) ++i;
                token.text += text[i];
            }
            ++i;
        } else {
            while (i < text.size() && !is_space(text[i])) token.text += text[i++];
        }
        tokens.push_back(std::move(token));
    }
    return tokens;
}

std::string trim(const std::string& text) {
    size_t begin = 0;
    size_t end = text.size();
    while (begin < end && is_space(text[begin])) ++begin;
    while (end > begin && is_space(text[end - 1])) --end;
    return text.substr(begin, end - begin);
}

// Docker's keys for one registry: "https://index.docker.io/v1/", "127.0.0.1:5000", ...
std::string normalized_registry(std::string key) {
    for (const char* scheme : {"https://", "http://"}) {
        if (key.starts_with(scheme)) key.erase(0, std::string(scheme).size());
    }
    key = key.substr(0, key.find('/'));
    if (key == "docker.io" || key == "index.docker.io") return kDockerHubRegistry;
    return key;
}

}  // namespace

std::vector<NetrcEntry> parse_netrc(const std::string& text) {
    std::vector<NetrcEntry> entries;
    const auto tokens = netrc_tokens(text);
    NetrcEntry* current = nullptr;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::string& keyword = tokens[i].text;
        if (keyword == "machine" && i + 1 < tokens.size()) {
            entries.push_back({tokens[++i].text, "", ""});
            current = &entries.back();
        } else if (keyword == "default") {
            current = nullptr;  // credentials for any host are not sent to registries
        } else if (keyword == "macdef") {
            // A macro runs to the next empty line.
            const size_t end = text.find("\n\n", tokens[i].start);
            while (i + 1 < tokens.size() &&
                   (end == std::string::npos || tokens[i + 1].start < end)) {
                ++i;
            }
            current = nullptr;
        } else if ((keyword == "login" || keyword == "password" || keyword == "account") &&
                   i + 1 < tokens.size()) {
            const NetrcToken& value = tokens[++i];
            if (current == nullptr) continue;
            if (keyword == "login") {
                current->login = value.text;
            } else if (keyword == "password") {
                if (value.text.starts_with("$")) {
                    // enroot evaluates the rest of the line, spaces included.
                    current->password =
                        trim(text.substr(value.start, value.line_end - value.start));
                    while (i + 1 < tokens.size() && tokens[i + 1].start < value.line_end) ++i;
                } else {
                    current->password = value.text;
                }
            }
        }
    }
    return entries;
}

std::string evaluate_netrc_password(const std::string& password) {
    if (!password.starts_with("$")) return password;
    // The user's own configuration asks for a shell here (enroot documents `$(command)`).
    FILE* shell = ::popen(("echo " + password).c_str(), "r");
    if (shell == nullptr) throw system_error("cannot run a shell for a .credentials password");
    std::string output;
    char buffer[4096];
    size_t count = 0;
    while ((count = std::fread(buffer, 1, sizeof buffer, shell)) > 0) output.append(buffer, count);
    const int status = ::pclose(shell);
    if (status != 0) {
        throw Error("the shell evaluating a .credentials password failed: " + password);
    }
    while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
    if (output.empty()) {
        // A command that failed inside $(…) leaves nothing; sending an empty password would only
        // earn a confusing refusal from the registry.
        throw Error("a .credentials password evaluated to nothing: " + password);
    }
    return output;
}

std::string netrc_user_for(const std::vector<NetrcEntry>& entries, const std::string& host) {
    for (const auto& entry : entries) {
        if (entry.machine == host && !entry.login.empty()) return entry.login;
    }
    return "";
}

std::optional<Credentials> netrc_credentials(const std::vector<NetrcEntry>& entries,
                                             const std::string& host, const std::string& user) {
    for (const auto& entry : entries) {
        if (entry.machine != host) continue;
        if (!user.empty() && entry.login != user) continue;
        return Credentials{entry.login, evaluate_netrc_password(entry.password)};
    }
    return std::nullopt;
}

std::optional<Credentials> docker_config_credentials(const std::string& config_text,
                                                     const std::string& registry,
                                                     const std::string& user) {
    nlohmann::json config;
    try {
        config = nlohmann::json::parse(config_text);
    } catch (const nlohmann::json::exception& e) {
        throw Error(std::string("invalid Docker config.json: ") + e.what());
    }
    if (!config.is_object() || !config.contains("auths") || !config["auths"].is_object()) {
        return std::nullopt;
    }
    const std::string wanted = normalized_registry(registry);
    for (const auto& [key, entry] : config["auths"].items()) {
        if (normalized_registry(key) != wanted || !entry.is_object()) continue;
        Credentials credentials;
        if (entry.contains("auth") && entry["auth"].is_string() &&
            !entry["auth"].get<std::string>().empty()) {
            const std::string decoded = base64_decode(entry["auth"].get<std::string>());
            const auto colon = decoded.find(':');
            if (colon == std::string::npos) {
                throw Error("invalid Docker config.json: the auth of " + key +
                            " is not base64 of user:password");
            }
            credentials = {decoded.substr(0, colon), decoded.substr(colon + 1)};
        } else if (entry.value("username", "") != "") {
            credentials = {entry.value("username", ""), entry.value("password", "")};
        } else {
            continue;
        }
        if (!user.empty() && credentials.user != user) continue;
        return credentials;
    }
    return std::nullopt;
}

std::filesystem::path docker_config_path() {
    const char* configured = std::getenv("DOCKER_CONFIG");
    if (configured != nullptr && *configured != '\0') {
        return std::filesystem::path(configured) / "config.json";
    }
    const char* home = std::getenv("HOME");
    if (home == nullptr || *home == '\0') return {};
    return std::filesystem::path(home) / ".docker" / "config.json";
}

std::optional<AuthChallenge> parse_www_authenticate(const std::string& value) {
    AuthChallenge challenge;
    size_t i = 0;
    while (i < value.size() && is_space(value[i])) ++i;
    while (i < value.size() && !is_space(value[i]) && value[i] != ',') {
        challenge.scheme += value[i++];
    }
    if (challenge.scheme.empty()) return std::nullopt;
    while (i < value.size()) {
        while (i < value.size() && (is_space(value[i]) || value[i] == ',')) ++i;
        std::string name;
        while (i < value.size() && value[i] != '=' && !is_space(value[i]) && value[i] != ',') {
            name += static_cast<char>(std::tolower(static_cast<unsigned char>(value[i++])));
        }
        if (name.empty()) break;
        if (i >= value.size() || value[i] != '=') {
            // A second challenge ("…, Basic realm=…") starts: the first one is complete.
            break;
        }
        ++i;
        std::string parameter;
        if (i < value.size() && value[i] == '"') {
            for (++i; i < value.size() && value[i] != '"'; ++i) {
                if (value[i] == '\\' && i + 1 < value.size()) ++i;
                parameter += value[i];
            }
            if (i >= value.size()) return std::nullopt;  // unterminated quoted string
            ++i;
        } else {
            while (i < value.size() && value[i] != ',' && !is_space(value[i])) {
                parameter += value[i++];
            }
        }
        challenge.parameters[name] = parameter;
    }
    return challenge;
}

std::string base64_encode(const std::string& data) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < data.size(); i += 3) {
        const unsigned n = (static_cast<unsigned char>(data[i]) << 16) |
                           (static_cast<unsigned char>(data[i + 1]) << 8) |
                           static_cast<unsigned char>(data[i + 2]);
        out += {kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], kAlphabet[(n >> 6) & 63],
                kAlphabet[n & 63]};
    }
    if (i + 1 == data.size()) {
        const unsigned n = static_cast<unsigned char>(data[i]) << 16;
        out += {kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], '=', '='};
    } else if (i + 2 == data.size()) {
        const unsigned n = (static_cast<unsigned char>(data[i]) << 16) |
                           (static_cast<unsigned char>(data[i + 1]) << 8);
        out +=
            {kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], kAlphabet[(n >> 6) & 63], '='};
    }
    return out;
}

std::string base64_decode(const std::string& text) {
    auto value_of = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+' || c == '-') return 62;
        if (c == '/' || c == '_') return 63;
        return -1;
    };
    std::string out;
    unsigned bits = 0;
    int count = 0;
    for (char c : text) {
        if (c == '=' || is_space(c)) continue;
        const int value = value_of(c);
        if (value < 0) throw Error("invalid base64");
        bits = (bits << 6) | static_cast<unsigned>(value);
        count += 6;
        if (count >= 8) {
            count -= 8;
            out += static_cast<char>((bits >> count) & 0xff);
        }
    }
    return out;
}

}  // namespace sqbox

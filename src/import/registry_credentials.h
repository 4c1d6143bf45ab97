// Where registry credentials come from, and how a registry asks for them: enroot's
// $ENROOT_CONFIG_PATH/.credentials (netrc), Docker's config.json, and WWW-Authenticate challenges.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sqbox {

struct Credentials {
    std::string user;
    std::string password;
};

// One `machine HOST login USER password PASSWORD` entry of a netrc file.
struct NetrcEntry {
    std::string machine;
    std::string login;
    std::string password;  // as written; enroot evaluates one starting with "$" (see below)
};

// The entries of a netrc text, in order (`default` entries and macros are skipped).
std::vector<NetrcEntry> parse_netrc(const std::string& text);

// A password starting with "$" is, as in enroot, the output of `echo PASSWORD` in a shell: an
// environment variable or a command's output. Throws Error when the shell fails.
std::string evaluate_netrc_password(const std::string& password);

// The user enroot infers for `registry` when the URI names none: the login of the first entry for
// its host (without port). Empty when the file has none.
std::string netrc_user_for(const std::vector<NetrcEntry>& entries, const std::string& host);

// The credentials for `host` (and `user` when not empty), evaluated; nullopt when none.
std::optional<Credentials> netrc_credentials(const std::vector<NetrcEntry>& entries,
                                             const std::string& host, const std::string& user);

// Docker's config.json `auths` entry for `registry` (keys may be URLs; Docker Hub's aliases are
// one), decoded from base64 "user:password" or from username/password. Throws Error when the file
// is not valid JSON.
std::optional<Credentials> docker_config_credentials(const std::string& config_text,
                                                     const std::string& registry,
                                                     const std::string& user);

// Docker's config file: $DOCKER_CONFIG/config.json, else ~/.docker/config.json ("" if no home).
std::filesystem::path docker_config_path();

// A WWW-Authenticate challenge: its scheme (Bearer, Basic) and parameters (lower-case names).
struct AuthChallenge {
    std::string scheme;
    std::map<std::string, std::string> parameters;
};

// Parses the first challenge of a WWW-Authenticate value; nullopt when it is malformed.
std::optional<AuthChallenge> parse_www_authenticate(const std::string& value);

std::string base64_encode(const std::string& data);
// Throws Error on invalid input.
std::string base64_decode(const std::string& text);

}  // namespace sqbox

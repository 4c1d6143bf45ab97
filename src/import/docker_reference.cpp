#include "import/docker_reference.h"

#include <array>
#include <regex>

#include "util/errors.h"

namespace sqbox {
namespace {

// The character classes enroot's parser accepts for each part. The user's class is the userinfo
// of RFC 3986 (its ",-@" is a range: it also admits "-./0-9:;<=>?@").
constexpr const char* kUser = "[[:alnum:]_.!~*'()%;:&=+$,-@]+";
constexpr const char* kImage = "[a-z0-9/._-]+";
constexpr const char* kTag = "[[:alnum:]._:-]+";
constexpr const char* kDigest = "sha256:[[:alnum:]]+";

enum class Form {
    DockerStyle,  // [USER@]FIRST/REST: FIRST is a registry when it has a "." or ":", else a Hub
                  // namespace
    HubOfficial,  // [USER@]IMAGE: a Docker Hub official image (library/IMAGE)
    EnrootStyle,  // [USER@]REGISTRY#IMAGE
};

struct Pattern {
    Form form;
    std::regex regex;  // groups: 1 user, 2 registry or first part (absent for HubOfficial), then
                       // image, tag, digest
};

std::string group(const char* pattern) {
    return std::string("(") + pattern + ")";
}

// Each form with a tag and a digest, with a digest, then with an optional tag: enroot's order,
// which decides between readings such as USER@IMAGE:TAG and IMAGE@DIGEST.
std::vector<Pattern> make_patterns() {
    const std::string user = "(?:" + group(kUser) + "@)?";
    const std::string tag = ":" + group(kTag);
    const std::string digest = "@" + group(kDigest);
    const std::string no_tag = "()";
    const std::string optional_tag = "(?::" + group(kTag) + ")?";
    const std::pair<Form, std::string> heads[] = {
        {Form::DockerStyle, "([^/#]+)/" + group(kImage)},
        {Form::HubOfficial, "()([^/@#:]+)"},
        {Form::EnrootStyle, "([^#/@]+)#" + group(kImage)},
    };
    std::vector<Pattern> patterns;
    for (const auto& [form, head] : heads) {
        for (const std::string& ending : {tag + digest, no_tag + digest, optional_tag + "()"}) {
            patterns.push_back({form, std::regex("^docker://" + user + head + ending + "$")});
        }
    }
    return patterns;
}

}  // namespace

std::string DockerReference::display() const {
    return registry + "#" + image + (by_digest() ? "@" : ":") + reference;
}

std::string registry_host(const std::string& registry) {
    // enroot strips the last ":…" (the port); a bracketed IPv6 address keeps its colons.
    const auto colon = registry.rfind(':');
    if (colon == std::string::npos || registry.find(']', colon) != std::string::npos) {
        return registry;
    }
    return registry.substr(0, colon);
}

DockerReference parse_docker_uri(const std::string& uri) {
    static const std::vector<Pattern> patterns = make_patterns();
    for (const auto& pattern : patterns) {
        std::smatch match;
        if (!std::regex_match(uri, match, pattern.regex)) continue;
        DockerReference reference;
        reference.user = match[1].str();
        std::string first = match[2].str();
        reference.image = match[3].str();
        // A digest wins over a tag, as in enroot.
        reference.reference = match[5].length() > 0 ? match[5].str() : match[4].str();
        switch (pattern.form) {
            case Form::DockerStyle:
                if (first.find_first_of(".:") != std::string::npos) {
                    reference.registry = first;
                } else {
                    reference.registry = kDockerHubRegistry;
                    reference.image = first + "/" + reference.image;
                }
                break;
            case Form::HubOfficial:
                reference.registry = kDockerHubRegistry;
                reference.image = "library/" + reference.image;
                break;
            case Form::EnrootStyle:
                reference.registry = first;
                break;
        }
        if (reference.reference.empty()) reference.reference = "latest";
        if (reference.registry == "docker.io" || reference.registry == "index.docker.io" ||
            reference.registry == kDockerHubRegistry) {
            reference.registry = kDockerHubRegistry;
            if (reference.image.find('/') == std::string::npos) {
                reference.image = "library/" + reference.image;
            }
        }
        return reference;
    }
    throw Error("invalid image reference: " + uri);
}

}  // namespace sqbox

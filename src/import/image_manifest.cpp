#include "import/image_manifest.h"

#include <sys/utsname.h>

#include <nlohmann/json.hpp>

#include "import/sha256.h"
#include "util/errors.h"

namespace sqbox {
namespace {

using nlohmann::json;

std::string string_field(const json& object, const char* name) {
    const auto it = object.find(name);
    return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

Descriptor descriptor(const json& object, const std::string& what) {
    if (!object.is_object()) throw Error(what + ": a descriptor is not a JSON object");
    Descriptor result;
    result.media_type = string_field(object, "mediaType");
    result.digest = string_field(object, "digest");
    if (!is_sha256_digest(result.digest)) {
        throw Error(what + ": unsupported or malformed digest \"" + result.digest +
                    "\" (only sha256 is accepted)");
    }
    const auto size = object.find("size");
    if (size == object.end() || !size->is_number_integer() || size->get<int64_t>() < 0) {
        throw Error(what + ": descriptor " + result.digest + " has no valid size");
    }
    result.size = size->get<int64_t>();
    return result;
}

}  // namespace

ParsedManifest parse_manifest(const std::string& body, const std::string& content_type,
                              const std::string& what) {
    json document;
    try {
        document = json::parse(body);
    } catch (const json::exception&) {
        throw Error(what + " is not valid JSON");
    }
    if (!document.is_object()) throw Error(what + " is not a JSON object");
    std::string media_type = string_field(document, "mediaType");
    if (media_type.empty()) media_type = content_type.substr(0, content_type.find(';'));
    if (media_type.starts_with("application/vnd.docker.distribution.manifest.v1") ||
        document.value("schemaVersion", 0) == 1) {
        throw Error(what + " is a Docker schema 1 manifest, which is not supported");
    }
    ParsedManifest manifest;
    const bool index_type = media_type == kDockerManifestList || media_type == kOciIndex;
    const bool image_type = media_type == kDockerManifest || media_type == kOciManifest;
    if (index_type || (!image_type && document.contains("manifests"))) {
        manifest.is_index = true;
        const auto entries = document.find("manifests");
        if (entries == document.end() || !entries->is_array()) {
            throw Error(what + ": a manifest list without \"manifests\"");
        }
        for (const auto& entry : *entries) {
            PlatformEntry platform{descriptor(entry, what), "", "", ""};
            if (const auto found = entry.find("platform");
                found != entry.end() && found->is_object()) {
                platform.os = string_field(*found, "os");
                platform.architecture = string_field(*found, "architecture");
                platform.variant = string_field(*found, "variant");
            }
            manifest.platforms.push_back(std::move(platform));
        }
        return manifest;
    }
    if (!image_type && !document.contains("layers")) {
        throw Error(what + " has an unsupported media type \"" + media_type + "\"");
    }
    const auto config = document.find("config");
    if (config == document.end()) throw Error(what + " has no config");
    manifest.config = descriptor(*config, what);
    const auto layers = document.find("layers");
    if (layers == document.end() || !layers->is_array() || layers->empty()) {
        throw Error(what + " has no layers");
    }
    for (const auto& layer : *layers) {
        Descriptor parsed = descriptor(layer, what);
        if (parsed.media_type.find("tar") == std::string::npos) {
            throw Error(what + ": layer " + parsed.digest + " has an unsupported media type \"" +
                        parsed.media_type + "\"");
        }
        manifest.layers.push_back(std::move(parsed));
    }
    return manifest;
}

std::string normalize_architecture(const std::string& architecture) {
    std::string name = architecture;
    if (name.empty()) {
        struct utsname host {};
        if (::uname(&host) != 0) throw system_error("uname");
        name = host.machine;
    }
    if (name == "x86_64") return "amd64";
    if (name == "aarch64") return "arm64";
    if (name == "i686" || name == "i386") return "386";
    return name;
}

const PlatformEntry& select_platform(const ParsedManifest& index, const std::string& architecture,
                                     const std::string& what) {
    std::string available;
    for (const auto& entry : index.platforms) {
        if ((entry.os.empty() || entry.os == "linux") && entry.architecture == architecture) {
            return entry;
        }
        if (entry.os == "unknown") continue;  // attestations, not images
        available += (available.empty() ? "" : ", ") + entry.os + "/" + entry.architecture +
                     (entry.variant.empty() ? "" : "/" + entry.variant);
    }
    throw Error(what + " has no linux/" + architecture + " image (it has: " +
                (available.empty() ? "none" : available) + "); choose one with -a/--arch");
}

}  // namespace sqbox

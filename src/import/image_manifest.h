// Registry manifests: Docker v2 schema 2 and OCI image manifests, Docker manifest lists and OCI
// indexes, parsed and checked, and the choice of one platform's manifest from a list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sqbox {

inline constexpr const char* kDockerManifestList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr const char* kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr const char* kDockerManifest =
    "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr const char* kOciManifest = "application/vnd.oci.image.manifest.v1+json";
// What a registry may answer a manifest request with, in the Accept header's form.
inline constexpr const char* kManifestAccept =
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json";

struct Descriptor {
    std::string media_type;
    std::string digest;  // sha256:<hex>, checked
    int64_t size = -1;   // bytes, checked non-negative
};

struct PlatformEntry {
    Descriptor manifest;
    std::string os;            // linux, windows, unknown (attestations), "" when absent
    std::string architecture;  // GOARCH
    std::string variant;       // v7, v8, ...
};

struct ParsedManifest {
    bool is_index = false;
    std::vector<PlatformEntry> platforms;  // of an index
    Descriptor config;                     // of an image manifest
    std::vector<Descriptor> layers;        // of an image manifest, base first
};

// Parses `body`, served with `content_type`; `what` names it in errors. Throws Error for JSON that
// is not one of the four kinds, schema 1 manifests, digests other than sha256, a manifest
// without layers.
ParsedManifest parse_manifest(const std::string& body, const std::string& content_type,
                              const std::string& what);

// The GOARCH name for `architecture`: uname's names (x86_64, aarch64) are translated, "" is the
// host's.
std::string normalize_architecture(const std::string& architecture);

// The linux/`architecture` entry of an index. Throws Error listing the platforms it has otherwise.
const PlatformEntry& select_platform(const ParsedManifest& index, const std::string& architecture,
                                     const std::string& what);

}  // namespace sqbox

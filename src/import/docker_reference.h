// enroot's `docker://` URIs: docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST], and the Docker form
// docker://[USER@]REGISTRY/IMAGE[:TAG|@DIGEST] enroot 4 also reads, with Docker Hub's defaults
// applied as enroot applies them.
#pragma once

#include <filesystem>
#include <string>

namespace sqbox {

inline constexpr const char* kDockerHubRegistry = "registry-1.docker.io";

struct DockerReference {
    std::string user;       // from USER@, empty when none was given
    std::string registry;   // host[:port]
    std::string image;      // the repository, e.g. library/ubuntu
    std::string reference;  // a tag, or a digest ("sha256:<hex>") which wins over a tag

    [[nodiscard]] bool by_digest() const { return reference.starts_with("sha256:"); }
    // host[:port]#image:tag or host[:port]#image@digest, for messages.
    [[nodiscard]] std::string display() const;
};

// Throws Error "invalid image reference: URI" for anything enroot would refuse.
DockerReference parse_docker_uri(const std::string& uri);

// The registry's host without its port: what enroot's .credentials `machine` lines name.
std::string registry_host(const std::string& registry);

}  // namespace sqbox

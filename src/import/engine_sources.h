// Images held by a local container engine, enroot's `dockerd://IMAGE` and `podman://IMAGE`:
// asked for over the engine's Docker Engine API socket (podman's service speaks the same API),
// not by running `docker` or `podman`. `GET /images/IMAGE/json` gives the image's ID and size,
// `GET /images/IMAGE/get` its `docker save` archive, which is streamed into a scratch directory
// (at most twice the reported size plus 64 MiB) and read as a docker-archive: source is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "import/local_sources.h"

namespace sqbox {

// True for dockerd:// and podman:// URIs.
bool is_engine_image_uri(const std::string& uri);

struct EngineImageReference {
    std::string engine;  // "dockerd" or "podman"
    std::string image;   // as given: NAME[:TAG] or an image ID
};

// enroot's syntax: dockerd://IMAGE or podman://IMAGE, IMAGE of [A-Za-z0-9/._:-] (and no path
// component starting with '.': it goes into a URL path). Throws Error ("Invalid image reference:
// URI") otherwise.
EngineImageReference parse_engine_uri(const std::string& uri);

// The socket of `engine`: dockerd: $DOCKER_HOST (unix://PATH) else /var/run/docker.sock;
// podman: $CONTAINER_HOST (unix://PATH) else /run/podman/podman.sock for root and
// $XDG_RUNTIME_DIR/podman/podman.sock for others. Throws Error when the variable names something
// other than a unix socket (tcp://, ssh://): sqbox speaks only to a local socket.
std::filesystem::path engine_socket_path(const std::string& engine);

struct EngineImageInfo {
    std::string id;    // "sha256:<hex>", the engine's image ID
    int64_t size = 0;  // bytes, as the engine reports them
    std::string architecture;
};

// The image's ID, size and architecture (`GET /images/IMAGE/json`). Throws Error with one line:
// no socket, permission denied, no such image (the engine's own message), a malformed answer.
EngineImageInfo inspect_engine_image(const std::string& uri);

// The image's layers and configuration, its archive's blobs kept in a scratch directory below
// `scratch_directory` for as long as the LocalImage lives. Throws Error with one line, leaving
// nothing behind.
std::unique_ptr<LocalImage> open_engine_image(const std::string& uri,
                                              const std::filesystem::path& scratch_directory);

}  // namespace sqbox

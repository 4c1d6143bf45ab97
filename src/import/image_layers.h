// An image as its ordered layers and its configuration, wherever it came from: a registry
// (import/registry.h), an OCI image layout or a docker/oci archive. What the squashfs writer of
// `sqbox import` takes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sqbox {

struct ImageLayer {
    std::filesystem::path blob;  // the layer's tar stream as stored (compressed or not), verified
    std::string media_type;      // e.g. application/vnd.oci.image.layer.v1.tar+gzip
    std::string digest;          // "sha256:<hex>" of the blob
};

struct ImageLayers {
    std::vector<ImageLayer> layers;  // base first
    nlohmann::json config;           // the image configuration (OCI or Docker schema 2)
    std::string manifest_digest;     // "sha256:<hex>" of the manifest the layers came from
};

}  // namespace sqbox

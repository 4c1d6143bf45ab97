// Images on the local disk, as `docker save`, `podman save` and `skopeo copy` write them:
//   oci:DIR[:REF] (or DIR, an existing directory)  an OCI image layout
//   oci-archive:FILE[:REF]                          an OCI image layout in a tar file
//   docker-archive:FILE[:REF]                       `docker save` format (manifest.json)
// REF picks one image of several (org.opencontainers.image.ref.name, or a RepoTag). Every blob
// is checked against its sha256 before use; archives are copied (blobs only, not unpacked) into
// a temporary directory that lives as long as the LocalImage.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "import/image_layers.h"

namespace sqbox {

struct LocalSourceOptions {
    std::string architecture;                 // GOARCH name; empty: the host's
    std::filesystem::path scratch_directory;  // where an archive's blobs go meanwhile
};

class LocalImage {
  public:
    LocalImage() = default;
    LocalImage(const LocalImage&) = delete;
    LocalImage& operator=(const LocalImage&) = delete;
    ~LocalImage();

    ImageLayers image;
    std::filesystem::path scratch;  // removed with everything in it, if set
};

// True for the URIs above (a plain path counts when it is a directory).
bool is_local_image_uri(const std::string& uri);

// Throws Error with one line (missing file, no such REF, digest mismatch, damaged archive).
std::unique_ptr<LocalImage> open_local_image(const std::string& uri,
                                             const LocalSourceOptions& options);

// Reads a docker archive (`docker save`'s format) from the stream `fd` into `local`, its blobs
// copied to `local.scratch` (which must exist) and checked; a compressed stream may expand
// 1100 times what was read of it. `image_id` (the daemon's "sha256:<hex>") picks the image whose
// configuration has that digest, else the archive must hold one image. `what` names the source
// in messages. Reads up to the archive's end, not necessarily to the stream's.
void load_docker_archive_stream(LocalImage& local, int fd, const std::string& image_id,
                                const std::string& what);

// The host's architecture in Go's names (amd64, arm64, ppc64le, ...).
std::string host_go_architecture();
// enroot's -a values (x86_64, aarch64, ppc64le) or Go's names, as Go's names.
std::string go_architecture(const std::string& name);

}  // namespace sqbox

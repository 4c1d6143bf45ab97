// Whether the sandbox reads a .sqsh image over FUSE or from a copy unpacked into the caller's
// cache, decided by the launcher before any namespace exists (docs/pods.md).
#pragma once

#include <optional>
#include <string>

#include "image/image_source.h"
#include "image/image_unpack.h"
#include "runtime/shared_image.h"
#include "sqbox/config.h"

namespace sqbox {

// How the sandbox reads its image. A .sqsh is served over FUSE where /dev/fuse can be opened
// (the supervisor opens it again itself: the kernel wants the device opened in the user namespace
// that mounts it; opening it here decides before any namespace exists);
// where it cannot (a pod without a device plugin), it is unpacked into the caller's cache
// (image/image_unpack.h) and `image` becomes that directory, held for as long as this lives.
struct ImageAccess {
    // "fuse", "shared", "unpacked" or "directory" (RunResult::image_access)
    std::string mode;
    std::optional<UnpackedImage> unpacked;
    std::optional<SharedImage> shared;  // "shared": the shared image server's mount
};
ImageAccess choose_image_access(ImageSource& image, const SandboxConfig& config);

// sqbox run: an image served over FUSE is served by the caller's shared image server
// (runtime/shared_image.h) where one can be had.
void use_shared_image_server(ImageAccess& access, const ImageSource& image,
                             const SandboxConfig& config);

}  // namespace sqbox

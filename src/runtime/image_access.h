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
};
ImageAccess choose_image_access(ImageSource& image, const SandboxConfig& config);

// sqbox run: whether an image served over FUSE may be served by the caller's shared image server
// (runtime/shared_image.h): not with --image-server-idle 0.
bool may_share_image(const ImageAccess& access, const SandboxConfig& config);

// The launcher, once the supervisor runs (the round trip to the server overlaps with its set-up):
// the shared server's mount and connection, or word that there are none (the supervisor then
// serves the image itself), to the supervisor on `handoff`.
void share_image_with_supervisor(ImageAccess& access, const ImageSource& image,
                                 const SandboxConfig& config, int handoff);

// The supervisor: what the launcher handed over on `handoff`; an empty SharedImage when it serves
// the image itself.
SharedImage receive_shared_image(int handoff);

}  // namespace sqbox

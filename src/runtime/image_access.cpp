#include "runtime/image_access.h"
#include "runtime/user_namespace.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "runtime/signals.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/process.h"
#include "util/user_directories.h"

namespace sqbox {

ImageAccess choose_image_access(ImageSource& image, const SandboxConfig& config) {
    ImageAccess access;
    if (image.kind == ImageSource::Kind::kDirectory) {
        access.mode = "directory";
        return access;
    }
    const UniqueFd fuse(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
    if (fuse) {
        access.mode = "fuse";
        return access;
    }
    const std::string why = std::string("/dev/fuse: ") + std::strerror(errno);
    // Whether a sandbox can be made at all, before minutes of unpacking for nothing (a pod whose
    // seccomp profile refuses user namespaces says so here, in its own words).
    require_user_namespaces();
    ImageUnpackLimits limits;
    // The launcher holds them (runtime/pipeline.cpp): one that comes stops the unpacking.
    limits.stop_signals = forwarded_signals();
    try {
        access.unpacked = unpack_image(&image.squashfs->fs, image.file.get(), image.path,
                                       sqbox_cache_directory(), limits);
    } catch (const Error& e) {
        throw Error("cannot run " + image.path + " without FUSE (" + why +
                    ") from an unpacked copy either: " + e.what() +
                    " (give the pod /dev/fuse, or unpack the image and run the directory)");
    }
    if (config.verbose) {
        print_error("image: " + why + "; running from an unpacked copy, " +
                    (access.unpacked->made ? "made now" : "made before") + ": " +
                    access.unpacked->root + " (" + std::to_string(access.unpacked->entries) +
                    " names, " + std::to_string(access.unpacked->bytes) + " bytes of files)");
    }
    ImageSource unpacked = open_image(access.unpacked->root);
    image = std::move(unpacked);
    access.mode = "unpacked";
    return access;
}

bool may_share_image(const ImageAccess& access, const SandboxConfig& config) {
    return access.mode == "fuse" && config.image_server_idle_seconds != 0;
}

void share_image_with_supervisor(ImageAccess& access, const ImageSource& image,
                                 const SandboxConfig& config, int handoff) {
    std::optional<SharedImage> shared = share_image(image, config);
    if (shared) access.mode = "shared";
    try {
        if (shared) {
            send_fd_message(handoff, MessageTag::kImageMount, {},
                            {shared->mount.get(), shared->connection.get()},
                            "cannot hand the shared image mount to the sandbox");
        } else {
            send_fd_message(handoff, MessageTag::kFailed, {}, {},
                            "cannot tell the sandbox to serve its image");
        }
    } catch (const Error&) {
        // The sandbox is already gone; its report says why.
    }
}

SharedImage receive_shared_image(int handoff) {
    std::optional<FdMessage> message = receive_fd_message(handoff);
    if (!message) throw Error("the launcher ended before handing over the image");
    if (message->tag == MessageTag::kFailed) return {};
    if (message->tag != MessageTag::kImageMount || message->fds.size() != 2) {
        throw Error("unexpected message from the launcher about the image");
    }
    return {std::move(message->fds[1]), std::move(message->fds[0])};
}

}  // namespace sqbox

// Building the filesystem the payload sees. Two halves:
//  - the supervisor (once per image): a private scratch root with the host's root kept at
//    /oldroot for reaching bind sources, and the image mounted read-only at /image;
//  - init (once per sandbox): the writable root (overlay of /image with a tmpfs upper layer, or a
//    read-only bind), /proc, /dev, /tmp, generated /etc files, user binds; then pivot_root.
#pragma once

#include <string>

#include "image/image_source.h"
#include "runtime/layer_replay.h"
#include "runtime/user_namespace.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

inline constexpr const char* kOldRootDir = "/oldroot";  // host root, inside the scratch root
inline constexpr const char* kImageDir = "/image";      // the image, read-only
inline constexpr const char* kSandboxDir = "/sandbox";  // per-sandbox tmpfs: upper layer, staging
// Directories of that tmpfs that the sandbox sees as /tmp and /dev/shm (one writable budget).
inline constexpr const char* kTmpArea = "tmp";
inline constexpr const char* kShmArea = "shm";
inline std::string writable_area(const char* area) {
    return std::string(kSandboxDir) + "/" + area;
}
// A container's layer over the image, where the supervisor saves what a --rw start wrote.
inline constexpr const char* kContainerViewDir = "/container";

// Supervisor: replaces the process's root with a small private tmpfs; the old root stays
// reachable at /oldroot until init detaches it.
void enter_scratch_root();

// Who may use an image's FUSE mount: any process of the mounter's user namespace and those below
// it (a sandbox's own mount), or processes with the mounter's ids in any user namespace (the
// shared image server's, which sandboxes in sibling user namespaces mount copies of).
enum class FuseUsers { kThisUserNamespace, kMountersIds };

// Supervisor: mounts the image read-only at /image. For a squashfs image, `fuse_fd` is an open
// /dev/fuse whose server must be started right after (requests block until it answers).
void mount_image(const ImageSource& image, int fuse_fd, const IdMapping& ids,
                 FuseUsers users = FuseUsers::kThisUserNamespace);

// A container's --rw start: the sandbox writes into its own bounded tmpfs like any other, and what
// it wrote is saved into the container's layer (on disk) when it has ended, so that the writable
// budget bounds what one start can add.
bool saves_changes_to_container(const SandboxConfig& config);

// Supervisor, before init copies the mount namespace: mounts the sandbox's tmpfs at /sandbox
// itself, so that it still holds it when the sandbox has ended.
void mount_sandbox_tmpfs_to_keep(const SandboxConfig& config);

// Supervisor, once the sandbox has ended (the image still served): replays the sandbox's upper
// layer onto the container's (runtime/layer_replay.h). Throws Error.
ReplaySummary save_changes_to_container(const SandboxConfig& config);

struct PreparedRoot {
    UniqueFd root;            // the sandbox's future "/"
    bool writable = false;    // overlay (true) or read-only bind of the image (false)
    bool etc_seeded = false;  // the generated /etc files are already in the writable layer
};

// Init: mounts the root's layers only (image, a container's layer, the writable layer) under
// /sandbox/root, with nothing mounted on top.
PreparedRoot mount_root_layers(const SandboxConfig& config);

// Init: builds the complete root described by `config` under /sandbox/root. Must run in the
// sandbox's own mount and pid namespaces (for /proc). Prints a warning and falls back to a
// read-only root when overlayfs is not permitted.
PreparedRoot assemble_rootfs(const SandboxConfig& config);

}  // namespace sqbox

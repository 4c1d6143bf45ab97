// The sandbox's /dev: a small tmpfs with only harmless devices, never the host's /dev.
#pragma once

#include <string>

namespace sqbox {

// Mounts /dev under `root_fd`: null, zero, full, random, urandom and tty bound from the host (a
// user namespace may not create device nodes), a private devpts instance with ptmx, /dev/shm
// bound from `shm_source` (a directory of the sandbox's writable tmpfs), and the usual
// fd/stdin/stdout/stderr links. The /dev tmpfs itself is made read-only afterwards.
void mount_devices(int root_fd, bool create_mount_point, const std::string& shm_source);

}  // namespace sqbox

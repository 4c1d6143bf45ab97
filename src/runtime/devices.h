// The sandbox's /dev: a small tmpfs with only harmless devices, never the host's /dev.
#pragma once

#include <cstdint>

namespace sqbox {

// Mounts /dev under `root_fd`: null, zero, full, random, urandom and tty bound from the host (a
// user namespace may not create device nodes), a private devpts instance with ptmx, a /dev/shm
// tmpfs capped at `shm_size_bytes`, and the usual fd/stdin/stdout/stderr links. The /dev tmpfs
// itself is made read-only afterwards.
void mount_devices(int root_fd, bool create_mount_point, uint64_t shm_size_bytes);

}  // namespace sqbox

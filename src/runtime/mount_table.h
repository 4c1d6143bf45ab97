// The mounts on top of the sandbox's root that its description asks for: the image's own
// /etc/fstab (enroot format) and the user's --mount / configuration entries, in fs_passno order.
#pragma once

#include <vector>

#include "sqbox/config.h"

namespace sqbox {

// Init, before pivot_root: reads the image's /etc/fstab below `root_fd` (when config.image_fstab),
// merges it with config.mounts (the image's entries first, then a stable sort by pass) and
// mounts everything. Missing mount points are created when `can_create` and the entry asks for
// it. An entry marked nofail only warns when it fails.
void apply_mount_table(int root_fd, const SandboxConfig& config, bool can_create);

}  // namespace sqbox

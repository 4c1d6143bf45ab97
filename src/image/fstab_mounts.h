// From enroot fstab entries to sqbox mounts, with sqbox's policy on where sources may come from.
#pragma once

#include <optional>
#include <string>

#include "image/fstab.h"
#include "sqbox/config.h"

namespace sqbox {

// What ${ENROOT_ROOTFS} expands to while fstab lines are read: a source that starts with it names
// a path inside the sandbox rather than on the host. (Not a path anyone can type by accident.)
inline constexpr const char* kRootfsMarker = "\x01ENROOT_ROOTFS";

enum class HostSources {
    kAllowed,  // the user's own entries (--mount, configuration): host paths, canonicalised here
    kRefused,  // the image's /etc/fstab: it may not reach into the host on its own, nor move or
               // detach sqbox's /proc, /dev or /sys
};

// Converts one entry. Returns nullopt for entries that only change mount propagation (the
// sandbox's mounts are all private already). Throws Error, naming entry.origin, for a refused
// host path, an unsupported filesystem type or option, or a host path that does not exist.
std::optional<MountSpec> mount_spec_from_fstab(const FstabEntry& entry, HostSources host_sources);

}  // namespace sqbox

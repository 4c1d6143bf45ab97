// Hiding the parts of /proc that describe the host or tune its kernel, as Docker and runc do.
#pragma once

namespace sqbox {

// Inside the sandbox's fresh procfs (at /proc under `root_fd`, before pivot_root, while the
// host's /dev/null is at /oldroot/dev/null): files that leak host or kernel internals are
// covered by the null device, directories of host hardware by an empty read-only tmpfs, and the
// kernel's knobs (/proc/sys, sysrq-trigger, ...) are made read-only. Entries this kernel lacks
// are skipped, and so, unless the payload runs as the host's root user (`payload_is_host_root`),
// are root-only files it could not open anyway (each mount costs startup time).
void mask_proc(int root_fd, bool payload_is_host_root);

}  // namespace sqbox

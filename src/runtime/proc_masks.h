// Hiding the parts of /proc that describe the host or tune its kernel, as Docker and runc do.
#pragma once

namespace sqbox {

// Inside the sandbox's fresh procfs (at /proc under `root_fd`, with /dev already populated):
// files that leak host or kernel internals are covered by /dev/null, directories of host
// hardware by an empty read-only tmpfs, and the kernel's knobs (/proc/sys, sysrq-trigger, ...)
// are made read-only. Entries this kernel lacks are skipped.
void mask_proc(int root_fd);

}  // namespace sqbox

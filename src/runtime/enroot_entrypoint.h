// How enroot starts a container's command (its enroot-switchroot): the image's /etc/rc, run by the
// container's shell with the command as arguments; without an rc, the command itself; with
// neither, an interactive shell.
#pragma once

#include <string>
#include <vector>

#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

// The container's shell: $SHELL of the payload's environment when it names an executable,
// otherwise /bin/sh.
std::string enroot_shell();

// A descriptor that survives execve and holds config.rc_script (so the shell can read it as
// /proc/self/fd/N, like enroot does), or an invalid one when there is no rc override.
UniqueFd make_rc_descriptor(const SandboxConfig& config);

// The argv to execute enroot_shell() with. Called in the payload, inside the sandbox's root, with
// its environment and working directory already set.
std::vector<std::string> enroot_start_command(const SandboxConfig& config, int rc_fd);

}  // namespace sqbox

// The enroot-compatible front end: `enroot COMMAND ...` when sqbox is invoked under the name
// "enroot" (a symlink on PATH), or `sqbox enroot COMMAND ...`. Same commands, options and exit
// statuses as enroot (usage: 0 when asked for, 1 when misused; errors: "[ERROR] ..." and 1),
// with sqbox's isolation always on.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sqbox/config.h"

namespace sqbox::cli {

// `program` is the name usage messages show; `args` are the words after it.
int enroot_main(const std::string& program, const std::vector<std::string>& args);

// `enroot start --mount ARG` (fstab fields separated by colons) as the sandbox will mount it;
// nullopt for an entry that only changes mount propagation. Throws Error as `start` reports it.
std::optional<MountSpec> enroot_mount_option(const std::string& argument);

// `enroot start --env KEY[=VAL]`: KEY alone takes the caller's value (empty if unset). Throws
// Error("Invalid argument: ARG") for a bad name, as enroot does.
std::pair<std::string, std::string> enroot_env_option(const std::string& argument);

}  // namespace sqbox::cli

// The enroot-compatible front end: `enroot COMMAND ...` when sqbox is invoked under the name
// "enroot" (a symlink on PATH), or `sqbox enroot COMMAND ...`. Same commands, options and exit
// statuses as enroot (usage: 0 when asked for, 1 when misused; errors: "[ERROR] ..." and 1),
// with sqbox's isolation always on.
#pragma once

#include <string>
#include <vector>

namespace sqbox::cli {

// `program` is the name usage messages show; `args` are the words after it.
int enroot_main(const std::string& program, const std::vector<std::string>& args);

}  // namespace sqbox::cli

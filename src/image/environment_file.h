// Parser for an image's /etc/environment (pam_env / enroot style KEY=VALUE lines).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/variable_names.h"

namespace sqbox {

using EnvironmentEntries = std::vector<std::pair<std::string, std::string>>;
// Returns the value of a variable referenced as ${NAME} or $NAME, or nullopt if unset.
using VariableLookup = std::function<std::optional<std::string>(const std::string&)>;

// Parses `content`. Blank lines and lines starting with '#' are ignored; an optional leading
// "export " is accepted; values may be wrapped in matching single or double quotes. ${NAME} and
// $NAME in unquoted and double-quoted values are replaced through `lookup` (unset: empty);
// single-quoted values are taken literally. A malformed line throws Error naming `source_name`
// and the line number.
EnvironmentEntries parse_environment_file(std::string_view content, const std::string& source_name,
                                          const VariableLookup& lookup);

// enroot's rule for its fstab and configuration files: only the braced form ${NAME} is a
// reference (replaced through `lookup`, unset: empty); everything else is kept as it is.
std::string substitute_braced_variables(std::string_view text, const VariableLookup& lookup);

}  // namespace sqbox

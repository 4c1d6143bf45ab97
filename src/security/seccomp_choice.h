// Resolving --seccomp: a built-in profile name, "none", or a profile file.
#pragma once

#include <optional>
#include <string>

#include "security/seccomp_filter.h"
#include "security/seccomp_profile.h"

namespace sqbox {

// Parses built-in profile "default"/"strict", or the file at `name_or_path`.
SeccompProfile load_seccomp_profile(const std::string& name_or_path);

// The compiled filter for --seccomp `choice`; nullopt for "none" (after a warning on stderr).
std::optional<SeccompFilter> prepare_seccomp(const std::string& choice);

// Whether `choice` is one of sqbox's own profiles or "none": then the payload may install its
// filter before its root is ready (SandboxPlan::seccomp_before_root_ready), as these profiles
// allow every call it makes once the filter is in place; a profile from a file may refuse any.
bool allows_seccomp_before_root_ready(const std::string& choice);

}  // namespace sqbox

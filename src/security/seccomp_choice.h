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

// Whether `choice` is one of sqbox's own profiles or "none": then the payload may be started
// before its root is ready (SandboxPlan::payload_may_start_early), as these profiles allow every
// call it makes once its filter is in place; a profile from a file may refuse any of them.
bool allows_early_payload_start(const std::string& choice);

}  // namespace sqbox

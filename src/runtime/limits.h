// Per-process resource limits for the payload (setrlimit). cgroup limits arrive with hardening.
#pragma once

#include "sqbox/config.h"

namespace sqbox {

// Applies `limits` to the calling process; core dumps are always disabled. Soft and hard limits
// are equal except for CPU time, whose hard limit is one second later so the payload first gets
// SIGXCPU and then SIGKILL.
void apply_resource_limits(const ResourceLimits& limits);

}  // namespace sqbox

// Per-process resource limits for the payload (setrlimit). cgroup limits arrive with hardening.
#pragma once

#include <cstdint>
#include <optional>

#include "sqbox/config.h"

namespace sqbox {

// Applies `limits` to the calling process; core dumps are always disabled. Soft and hard limits
// are equal except for CPU time, whose hard limit is one second later so the payload first gets
// SIGXCPU and then SIGKILL.
void apply_resource_limits(const ResourceLimits& limits);

// The CPU time part of it alone (nothing for none): a pooled sandbox's payload, set up before its
// request, learns its CPU time with the request.
void apply_cpu_time_limit(const std::optional<uint64_t>& cpu_seconds);

}  // namespace sqbox

// The library entry point: run one sandbox to completion.
#pragma once

#include "sqbox/config.h"
#include "sqbox/result.h"

namespace sqbox {

// Runs config.command inside a fresh sandbox built from config.image and waits for it. Never
// throws for failures of the payload; sqbox's own failures are reported in RunResult::error with
// exit_status 125 (and a line on stderr). Must be called from a single-threaded process.
RunResult run_sandbox(const SandboxConfig& config);

}  // namespace sqbox

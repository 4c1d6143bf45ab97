// The library entry point: run one sandbox to completion.
#pragma once

#include <functional>

#include "sqbox/config.h"
#include "sqbox/result.h"

namespace sqbox {

// Runs config.command inside a fresh sandbox built from config.image and waits for it. Never
// throws for failures of the payload; sqbox's own failures are reported in RunResult::error with
// exit_status 125 (and a line on stderr). Must be called from a single-threaded process.
//
// From the sandbox's start on, SIGINT, SIGTERM, SIGHUP and SIGQUIT are held and passed on to the
// payload; `handle_result` (writing a record, say) runs before they are let through again, so
// that one arriving as the sandbox ends cannot end the caller between the two.
using ResultHandler = std::function<void(const RunResult&)>;
RunResult run_sandbox(const SandboxConfig& config, const ResultHandler& handle_result = {});

}  // namespace sqbox

// serve's zygote (docs/serve.md, "The zygote"): one sandbox whose python3 has imported the
// --preload modules and forks a new sandbox of its own for each run_python request
// (src/session/zygote.py inside; the argument in SECURITY.md). This file holds what the server
// hands the zygote; jobs_zygote.cpp keeps it and its requests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/sandbox_plan.h"

namespace sqbox {

// src/session/zygote.py, built into the binary.
std::string_view zygote_stub_source();

// What each request's sandbox is made with, as the zygote reads it (JSON): the server's own
// seccomp filter (`plan`'s, which must refuse namespaces: security/zygote_seccomp.h) and Landlock
// rules, the system call numbers, the unshare flags, and the server's --tmpfs-size and --pids.
std::string zygote_settings(const SandboxPlan& plan, const SandboxConfig& base);

// The zygote sandbox's command: python3 running the stub with `settings`, importing `preload`.
std::vector<std::string> zygote_command(const std::string& settings,
                                        const std::vector<std::string>& preload);

}  // namespace sqbox

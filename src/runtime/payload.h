// The last step: turning init's child into the payload.
#pragma once

#include <string>

#include "image/environment_file.h"
#include "runtime/sandbox_plan.h"
#include "sqbox/config.h"

namespace sqbox {

// The payload's PATH unless the image's /etc/environment or --env sets one.
inline constexpr const char* kDefaultPayloadPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// The payload's whole environment: defaults (PATH, HOME, TERM), then the image's
// /etc/environment (read from the current root), then the explicit --env settings.
EnvironmentEntries build_payload_environment(const SandboxConfig& config,
                                             const std::string& image_environment);

// Runs in the child forked by init, inside the final root. Resets signals, starts a new session
// (no controlling terminal), builds the environment, enters the working directory, applies
// limits, drops every privilege, applies Landlock and seccomp (last) and executes the command. On
// any failure it prints one line, sends a StageReport on `status_fd` (close-on-exec, so silence
// means the exec succeeded) and exits with 125, 126 or 127. `terminal_fd` (--tty) becomes the
// controlling terminal and fds 0-2; -1 keeps stdio as it is.
[[noreturn]] void exec_payload(const SandboxPlan& plan, int status_fd, int terminal_fd);

// What init sends on `ready_fd` once the root is complete.
inline constexpr char kRootReady = 'r';

// The same for a payload started before the root is ready (SandboxPlan::payload_may_start_early):
// while init still builds the root, it starts a new session, applies limits, drops every
// privilege and installs the seccomp filter; then it waits for kRootReady on `ready_fd` (anything
// else ends it quietly: init reports) and, in the final root, builds the environment, enters the
// working directory, applies Landlock and executes the command. No terminal (--tty starts late).
[[noreturn]] void exec_payload_once_root_ready(const SandboxPlan& plan, int status_fd,
                                               int ready_fd);

}  // namespace sqbox

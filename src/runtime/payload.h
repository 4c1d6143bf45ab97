// The last step: turning init's child into the payload.
#pragma once

#include <string>

#include "image/environment_file.h"
#include "runtime/sandbox_plan.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

// The payload's PATH unless the image's /etc/environment or --env sets one.
inline constexpr const char* kDefaultPayloadPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// The payload's whole environment: defaults (PATH, HOME, TERM), then the image's
// /etc/environment (read from the current root), then the explicit --env settings.
EnvironmentEntries build_payload_environment(const SandboxConfig& config,
                                             const std::string& image_environment);

// What the payload's process gets from init. It owns the descriptors; none but stdio survives
// exec.
struct PayloadContext {
    const SandboxPlan* plan = nullptr;
    // A StageReport on failure; close-on-exec, so silence means the command was executed.
    UniqueFd status;
    // Started early (init.h: starts_payload_early): where init sends kRootReady once the
    // root is complete; none when the root was complete before the payload started.
    UniqueFd ready;
    UniqueFd terminal;  // --tty: becomes the controlling terminal and 0-2; none keeps stdio
};

// The payload's process, from init's fork to execve: one order of steps, the first ones (which
// read nothing of the sandbox's files) done before the root is ready when started early.
// Defined in runtime/pipeline.cpp. On any failure it prints one line, sends a StageReport on
// its status descriptor and exits with 125, 126 or 127.
[[noreturn]] void run_payload(PayloadContext context);

// What init sends on the payload's `ready` descriptor once the root is complete.
inline constexpr char kRootReady = 'r';

// A new session (no controlling terminal: nothing the payload does reaches the caller's), default
// signal handling; with --tty, `terminal_fd` becomes the controlling terminal and 0-2.
void leave_callers_session(int terminal_fd);

// Blocks until init says the root is complete, then closes `ready` (returns at once if there is
// none). Anything but its word (init failed, and reports why itself) ends the payload before it
// runs anything.
void wait_until_root_ready(UniqueFd ready);

// A pooled sandbox's payload started early (sqbox serve): blocks until init hands it the request
// (the kGo message: its text, and its stdin, stdout and stderr, which replace 0-2 here), then
// closes `ready` and returns the text. Init gone (it failed, or the server went away before any
// request) ends the payload before it runs anything; a message without its three descriptors
// throws Error.
std::string wait_for_pooled_request(UniqueFd ready);

// In the final root: the environment (build_payload_environment) and the working directory.
void enter_payload_environment(const SandboxConfig& config);

// The payload's oom_score_adj (inherited by everything it starts; it may raise it, and lower it
// only back to its parents'). The sandbox's tmpfs pages belong to no process, so when they fill
// its memory limit the OOM killer picks by process size alone, and sqbox's init (larger than a
// small payload) would be chosen, ending the run as a failure of sqbox. Half the limit added to
// every payload process's score makes them chosen first, and on a host out of memory, the
// untrusted payload goes before the host's own processes.
inline constexpr int kPayloadOomScoreAdj = 500;
void prefer_payload_for_oom_kill();

// Every descriptor but stdio (and `kept`, the enroot rc script's, when it is one) closes at exec,
// whoever opened it (including anything the caller leaked into sqbox).
void close_descriptors_at_exec(int kept);

// Executes the command (or enroot's rc through the container's shell); reports 126/127 when it
// cannot.
[[noreturn]] void exec_command(const SandboxPlan& plan, int status_fd, int rc_fd);

}  // namespace sqbox

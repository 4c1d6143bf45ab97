// PID 1 of the sandbox. Its steps, in the order runtime/pipeline.cpp calls them.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "runtime/sandbox_plan.h"
#include "runtime/stage_report.h"
#include "runtime/terminal.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

// What init gets from the supervisor (or sqbox serve's). It owns the descriptors, and keeps no
// other: each closes once init is done with it, before the payload exists.
struct InitContext {
    const SandboxPlan* plan = nullptr;
    UniqueFd report;    // StageReport to the supervisor
    UniqueFd lifeline;  // read end of a pipe the supervisor holds open: EOF = supervisor gone
    // sqbox run: init is started before the image is mounted, in the supervisor's mount namespace;
    // one byte here says the image is ready, and init takes its own copy of the mount namespace.
    // None: init was cloned into its own mount namespace with the image already there.
    UniqueFd image_ready;
    // A SOCK_SEQPACKET channel to the launcher (or sqbox serve's supervisor): init first receives
    // the files that move it into the sandbox's cgroup (MessageTag::kCgroup, or kCgroupError);
    // a pooled sandbox then its request (kGo); with --tty it sends the terminal's master.
    UniqueFd channel;
    // sqbox serve: the request's stdin, stdout and stderr (none for sqbox run or a pooled
    // sandbox); init moves them to 0-2.
    std::array<UniqueFd, 3> stdio;
};

// In init, just cloned: its context from its supervisor's pipes, whose init ends it takes
// (report's write end, lifeline's read end) and whose supervisor ends it drops, and `channel`.
InitContext take_init_context(const SandboxPlan& plan, Pipe& report, Pipe& lifeline,
                              UniqueFd channel);

// Runs as the first process of fresh pid, mount, network, ipc, uts and cgroup namespaces: creates
// the network namespace with loopback up, sets the hostname, assembles the root and pivots into it,
// then starts the payload, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, reaps every orphan, and
// reports how the payload ended. Its exit takes every remaining process of the sandbox with it.
// Defined in runtime/pipeline.cpp.
[[noreturn]] void run_init(InitContext context);

// getppid() is 0 in init (the parent lives outside the pid namespace), so the usual race check
// after PR_SET_PDEATHSIG uses the lifeline pipe instead. Also makes init non-dumpable: the payload
// runs with the same uid and must not open /proc/1/{exe,mem,fd,...}.
void die_with_supervisor(int lifeline_fd);

// Closes every descriptor init inherited but its own: its context's, sqbox's diagnostics, 0-2.
void keep_only_init_descriptors(const InitContext& context);

// sqbox serve: init is in a user namespace of its own (SandboxPlan::own_user_namespace) and maps
// these ids to themselves.
void enter_own_user_namespace(const std::pair<uid_t, gid_t>& ids);

// sqbox run starts init while the supervisor still mounts the image: waits for its word, then
// leaves the supervisor's mount namespace for a copy of it. EOF means the supervisor failed, and
// its own report says why.
void take_mount_namespace_when_image_ready(UniqueFd image_ready);

// sqbox serve: the request's stdio becomes 0-2 (everything else the long-lived supervisor holds,
// other sandboxes' pipes and its control socket, was closed on entry: keep_only_init_descriptors).
void adopt_request_stdio(InitContext& context);

// enroot export: the merged layers, as the sandbox would see them at its root, packed into a new
// image on the host. Nothing runs from the image.
[[noreturn]] void export_root(const InitContext& context, const SandboxConfig& config);

// Moves init into the sandbox's cgroup (if it has one) before the payload exists, then makes the
// current cgroup the root of a fresh cgroup namespace: the payload sees "/" and nothing of the
// host's tree. The launcher sends the cgroup's join files on `channel`, with the limits it holds,
// which the payload then does not apply as rlimits.
void enter_sandbox_cgroup(int channel, ResourceLimits& rlimits);

// Whether the payload starts before the root is ready: a profile of sqbox's own (or none), and no
// --tty. A pooled sandbox's payload then waits, set up as far as it can be, for its request.
bool starts_payload_early(const SandboxPlan& plan);

// The payload's process, as init holds it.
struct PayloadProcess {
    pid_t pid = -1;
    UniqueFd exec_status;  // EOF once the command runs; a StageReport if it could not
    UniqueFd ready;        // started early: where init says the root is ready (kRootReady)
};

// Forks the payload before init builds the root; it runs run_payload's early steps meanwhile.
PayloadProcess start_payload_early(const SandboxPlan& plan);

// The hostname, then the complete root (rootfs.h), then pivot_root into it.
void prepare_sandbox(const SandboxConfig& config);

// sqbox serve: sends the supervisor, on `channel`, a descriptor of init's mount namespace. The
// last process of a namespace tears its mounts down as it exits, waiting for RCU grace periods
// (milliseconds on a VM), before its parent learns of its end; the supervisor, holding the
// namespace, reports the sandbox's end first and has it torn down after.
void hand_mount_namespace_to_supervisor(int channel);

// A pooled sandbox: everything is set up; now the request arrives. Its stdio replaces 0-2, its
// command and additions complete the configuration. The server going away ends the sandbox.
// Returns the request's text, for a payload started early.
std::string await_request(int channel, SandboxConfig& config, SandboxPlan& plan);

// The text of a pooled sandbox's request (kGo: command, environment additions, working
// directory, CPU time) into its configuration. Throws Error when it is malformed.
void apply_pooled_request(const std::string& text, SandboxConfig& config, SandboxPlan& plan);

// --tty: a terminal of the sandbox's own, whose master is sent to the launcher on `channel`.
SandboxPty open_terminal_if_asked(const SandboxConfig& config, int channel);

// Forks the payload once the root is complete; `terminal` (--tty's slave, if any) goes to it and
// closes here.
PayloadProcess start_payload(const SandboxPlan& plan, UniqueFd terminal);

// An early payload waits for the root: tells it the root is ready, or, in a pooled sandbox, hands
// it the request (its text, and 0-2, the request's stdio).
void release_early_payload(PayloadProcess& payload, const std::optional<std::string>& request);

// Waits until the payload has executed its command or failed to (forwarding signals), says so
// early on `report_fd`, then until it ends, reaping every orphan; returns how it ended.
StageReport supervise_payload_to_end(PayloadProcess& payload, int report_fd,
                                     std::chrono::steady_clock::time_point started);

}  // namespace sqbox

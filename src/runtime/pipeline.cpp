// The launch of one sandbox, in order: which process does which step. Every step is one call into
// the file of its concern; this file holds the order and nothing else.
//
//   launcher    the caller's process: the image, /dev/fuse, the policy, the cgroup, stdio, signals
//    └─ supervisor      clone(NEWUSER | NEWNS): root of the sandbox's user namespace, owns the
//    mounts
//        ├─ image server    fork: serves the .sqsh over FUSE; lives as long as the sandbox (unless
//        │                  the caller's shared image server serves it: runtime/shared_image.h)
//        └─ init            clone(NEWPID | NEWIPC | NEWUTS): PID 1; makes its network and cgroup
//            │              namespaces, builds the root, pivots into it, reaps, reports
//            └─ payload     fork: drops everything, confines itself, executes the command
//
// `sqbox serve` (session/warm_supervisor.cpp) keeps one supervisor and image server per image and
// starts every sandbox's init under it with run_init below: the same init and payload steps.
//
// Each step only narrows what the next may do; seccomp comes last but for the calls that sqbox's
// own profiles allow (see run_payload). Every process dies with its parent, and the kernel takes
// the sandbox's processes and mounts with init and the supervisor: nothing is left to undo.
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>

#include "image/image_source.h"
#include "runtime/cgroups.h"
#include "runtime/enroot_entrypoint.h"
#include "runtime/image_access.h"
#include "runtime/init.h"
#include "runtime/launcher.h"
#include "runtime/limits.h"
#include "runtime/network.h"
#include "runtime/payload.h"
#include "runtime/rootfs.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/stdio_relay.h"
#include "runtime/supervisor.h"
#include "runtime/terminal.h"
#include "runtime/user_namespace.h"
#include "security/capabilities.h"
#include "security/landlock.h"
#include "security/seccomp_filter.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {

// ---- the launcher: the caller's process ----

namespace {

// Steps 1 to 8, with the forwarded signals held by the caller (run_sandbox).
RunResult launch(const SandboxConfig& config) {
    // 1. What needs the caller's view of the host, checked before any namespace exists.
    ImageSource image = open_image(config.image);
    ImageAccess access = choose_image_access(image, config);
    // 2. The policy: the seccomp filter, Landlock, limits and where each is enforced.
    std::optional<SandboxCgroup> cgroup = plan_cgroup_before_start(config);
    SandboxPlan plan = plan_run(config, cgroup ? &*cgroup : nullptr);
    // 3. The channels: the supervisor's report, init's channel (cgroup, terminal), and the
    //    supervisor's for the shared image server's mount.
    Pipe report = make_pipe("supervisor report");
    auto [channel, init_channel] = make_message_channel("the sandbox's channel");
    auto [image_handoff, supervisor_image_handoff] =
        may_share_image(access, config) ? make_message_channel("the image's channel")
                                        : std::pair<UniqueFd, UniqueFd>{};
    // 4. The payload's stdio: relayed where the caller's cannot be handed over as it is.
    StdioRelay relay(config.output_limit_bytes, config.tty, channel.get());
    std::optional<ScopedIgnoreSigpipe> ignore_sigpipe;
    if (relay.active()) ignore_sigpipe.emplace();

    // 5. The supervisor, in a new user and mount namespace, unless a forwarded signal came
    //    first: then nothing starts, and the caller still gets the record.
    if (const std::optional<int> signal = pending_forwarded_signal()) {
        return stopped_before_start(config, *signal);
    }
    const pid_t launcher = ::getpid();
    const pid_t pid = clone_into_user_namespace(CLONE_NEWNS, "the sandbox's user namespace");
    if (pid == 0) {
        report.read_end.reset();
        channel.reset();
        if (relay.active()) adopt_diagnostics_fd(relay.install_in_child());
        run_supervisor({&plan, &image, launcher, std::move(report.write_end),
                        std::move(init_channel), std::move(supervisor_image_handoff),
                        SharedImage{}});
    }
    ChildProcess supervisor(pid);
    report.write_end.reset();
    relay.close_child_ends();
    init_channel.reset();
    supervisor_image_handoff.reset();

    // 6. While the sandbox is being set up: the image's shared server (started if none runs
    //    yet), whose mount the supervisor waits for; then the cgroup, which init joins.
    if (image_handoff) {
        share_image_with_supervisor(access, image, config, image_handoff.get());
        image_handoff.reset();
    }
    hand_over_cgroup(config, cgroup, channel.get());
    // 7. Signals forwarded and stdio relayed until the sandbox is gone; then the cgroup goes
    //    while the supervisor tears its mounts down.
    bool oom_killed = false;
    const Supervision supervision = supervise(supervisor, relay, report.read_end.get(), [&] {
        if (!cgroup) return;
        oom_killed = cgroup->oom_killed();
        cgroup->remove();
    });
    // 8. The record, handed to the caller while the forwarded signals are still held.
    RunResult result =
        result_of(supervision, relay, config, plan, cgroup ? &*cgroup : nullptr, oom_killed);
    result.image_access = access.mode;
    return result;
}

}  // namespace

RunResult run_sandbox(const SandboxConfig& config, const ResultHandler& handle_result) {
    // From the launch's first step until the caller has the result: a forwarded signal that
    // comes before the sandbox exists stops the launch (step 5), one that comes while it runs
    // goes to it, and one that comes as it ends (scancel's SIGTERM, then the batch script's
    // own) must not end the launcher before the caller has written the record.
    const ScopedSignalBlock block;
    RunResult result;
    try {
        result = launch(config);
    } catch (const Error& e) {
        if (const std::optional<int> signal = pending_forwarded_signal()) {
            // What failed was stopped by it (an unpacking): the signal is the reason.
            result = stopped_before_start(config, *signal);
        } else {
            print_error(e.what());
            result = RunResult{};
            result.seccomp = config.seccomp_profile;
            result.exit_status = kExitSqboxFailure;
            result.error = e.what();
        }
    }
    if (handle_result) handle_result(result);
    return result;
}

// ---- the supervisor: root of the sandbox's user namespace ----

void run_supervisor(SupervisorContext context) {
    const SandboxPlan& plan = *context.plan;
    const SandboxConfig& config = *plan.config;
    const ImageSource& image = *context.image;
    try {
        // 1. Tied to the launcher, out of the caller's process group (terminal signals reach only
        //    the launcher, which forwards them once), holding nothing the caller leaked.
        die_with_parent(context.launcher_pid);
        leave_process_group();
        close_fds_except(descriptors_of(context));
        // 2. The caller's ids mapped; no longer dumpable.
        const IdMapping ids = map_ids_and_seal(config);

        // 3. Init, before the image is mounted: the network namespace it makes first is built
        //    while the image is being mounted here.
        InitChannels init_channels = make_init_channels();
        auto started = std::chrono::steady_clock::now();
        const pid_t init_pid =
            clone_process(kSandboxNamespaces & ~CLONE_NEWNS, "sandbox namespaces");
        if (init_pid == 0) {
            run_init(init_channels.take_init_ends(plan, std::move(context.init_channel)));
        }
        ChildProcess init(init_pid);
        init_channels.close_init_ends();
        context.init_channel.reset();  // init's now

        // 4. The image at /image in a private scratch root: a copy of the shared image server's
        //    mount, once the launcher has it, or a mount of its own and its FUSE server.
        if (context.image_handoff) {
            // The launcher's wait for the server (bounded by the server's time limits) is not the
            // sandbox's: its --timeout counts without it, as when the launcher asked first.
            const auto asked = std::chrono::steady_clock::now();
            context.shared_image = receive_shared_image(context.image_handoff.get());
            context.image_handoff.reset();
            started += std::chrono::steady_clock::now() - asked;
        }
        ChildProcess server;
        if (context.shared_image.mount) {
            attach_shared_image(std::move(context.shared_image.mount));
            signal_when_shared_server_speaks(context.shared_image.connection.get());
        } else {
            server = mount_image_and_serve(image, ids, server_closes(context, init_channels));
        }
        // 5. The names every start needs, looked up ahead (on a thread of its own: no raw clone
        //    follows, only the stall probe's fork, runtime/image_mount_probe.h).
        start_look_ahead_of(image, config);
        // 6. Init may take its copy of the mount namespace now. A container's --rw start: with
        //    the sandbox's tmpfs in it, which this process keeps to save from at the end.
        if (saves_changes_to_container(config)) mount_sandbox_tmpfs_to_keep(config);
        tell_init_image_ready(init_channels.image_ready);

        // 7. The sandbox runs: the timeout, the launcher's signals, the image server's health.
        const SandboxEnd end = watch_sandbox(init, server, started, config.timeout_seconds,
                                             context.shared_image.connection.get());
        // 8. The report, once init is gone; the mounts go with this process.
        StageReport report = final_report(init_channels.report.read_end.get(), end, started, config,
                                          context.report.get());
        // 9. A container's --rw start: what the sandbox wrote, into the container's layer.
        if (saves_changes_to_container(config)) save_container_changes(config, report);
        server.kill_and_reap();
        send_report(context.report.get(), report);
        ::_exit(0);
    } catch (const Error& e) {
        fail_stage(context.report.get(), kExitSqboxFailure, e.what());
    }
}

// ---- init: PID 1 of the sandbox ----

void run_init(InitContext context) {
    const SandboxPlan& plan = *context.plan;
    const SandboxConfig& config = *plan.config;
    try {
        // 1. Tied to the supervisor, not dumpable, holding only its own descriptors (none of the
        //    host's the supervisor holds: the image, the report).
        die_with_supervisor(context.lifeline.get());
        keep_only_init_descriptors(context);
        // 2. Namespaces of its own: a user namespace (sqbox serve), the network (loopback only).
        //    sqbox serve's supervisor holds the mount namespace too, to have it torn down after the
        //    sandbox's end is reported rather than before.
        if (plan.own_user_namespace) {
            enter_own_user_namespace(*plan.own_user_namespace);
            hand_mount_namespace_to_supervisor(context.channel.get());
        }
        enter_loopback_only_network();
        // 3. Its own copy of the mount namespace, once the supervisor has mounted the image.
        if (context.image_ready) {
            take_mount_namespace_when_image_ready(std::move(context.image_ready));
        }
        // 4. sqbox serve: the request's stdio on 0-2, nothing else of the server's.
        adopt_request_stdio(context);
        // enroot export: the root's layers packed into an image; nothing runs.
        if (!config.export_image_path.empty()) export_root(context, config);
    } catch (const Error& e) {
        fail_stage(context.report.get(), kExitSqboxFailure, e);
    }

    StageReport report;
    try {
        SandboxConfig live_config = config;
        SandboxPlan live_plan = plan;
        live_plan.config = &live_config;
        // 5. The sandbox's cgroup and a cgroup namespace, before the payload exists.
        enter_sandbox_cgroup(context.channel.get(), live_plan.rlimits);
        // 6. The payload, started early where it may: its own set-up (run_payload's steps before
        //    the root is ready) overlaps with building the root.
        std::optional<PayloadProcess> early;
        if (starts_payload_early(plan)) early = start_payload_early(live_plan);
        // 7. The hostname, the root (overlay, /proc, /dev, /tmp, /etc, mounts), pivot_root.
        try {
            prepare_sandbox(config);
        } catch (const Error& e) {
            fail_stage(context.report.get(), kExitSqboxFailure, e);  // the payload dies with us
        }
        // 8. A pooled sandbox waits here for its request: command, environment, stdio.
        std::optional<std::string> request;
        if (plan.pooled) request = await_request(context.channel.get(), live_config, live_plan);
        // 9. --tty: a terminal of the sandbox's own; its master goes to the launcher.
        SandboxPty terminal = open_terminal_if_asked(config, context.channel.get());
        context.channel.reset();  // nothing more on it; the payload must not inherit it
        // 10. The payload runs from here: started now, or told that the root is ready.
        const auto started = std::chrono::steady_clock::now();
        PayloadProcess payload =
            early ? std::move(*early) : start_payload(live_plan, std::move(terminal.slave));
        release_early_payload(payload, request);
        // 11. Until the payload has executed its command (or failed to), then until it ends,
        //     reaping orphans and forwarding signals.
        report = supervise_payload_to_end(payload, context.report.get(), started);
    } catch (const Error& e) {
        print_error(e.what());
        report.exit_status = kExitSqboxFailure;
        report.set_error(e.what());
    }
    // 12. How the payload ended; init's exit ends every process of the sandbox.
    send_report(context.report.get(), report);
    ::_exit(0);
}

// ---- the payload ----

void run_payload(PayloadContext context) {
    const SandboxPlan& plan = *context.plan;
    const SandboxConfig& config = *plan.config;
    // A pooled sandbox's payload started early gets its command, environment, working directory
    // and CPU time with the request, into a copy of the plan: `live` is the plan it runs by.
    const bool awaits_request = plan.pooled && context.ready;
    SandboxConfig request_config;
    SandboxPlan request_plan;
    const SandboxPlan* live = &plan;
    UniqueFd rc_fd;
    // Before the root is ready: nothing here reads the sandbox's files. A payload started early
    // runs these while init builds the root, and tells a failure only once the root is ready: if
    // building it fails too, init's is the one line the caller gets.
    std::optional<std::string> early_failure;
    try {
        // 1. A new session (no controlling terminal but the sandbox's own with --tty), default
        //    signal handling.
        leave_callers_session(context.terminal.get());
        // 2. The rlimits the cgroup does not hold (CPU time and descriptors: once the request,
        //    the request's own CPU time and three descriptors, is here).
        ResourceLimits limits = plan.rlimits;
        if (awaits_request) {
            limits.cpu_seconds.reset();
            limits.open_files.reset();
        }
        apply_resource_limits(limits);
        // 3. enroot's rc script as a descriptor that survives exec.
        rc_fd = make_rc_descriptor(config);
        // 4. Every capability, securebits locked, no_new_privs.
        drop_all_privileges();
        // 5. seccomp now if the profile is sqbox's own: it allows every later step.
        if (plan.seccomp_before_root_ready && plan.seccomp) install_seccomp_filter(*plan.seccomp);
    } catch (const Error& e) {
        early_failure = e.what();
    }
    try {
        // 6. The root is ready (at once for a payload started late). A pooled sandbox's request
        //    comes with that word: its stdio onto 0-2, the rest into the plan.
        if (awaits_request) {
            const std::string request = wait_for_pooled_request(std::move(context.ready));
            request_config = config;
            request_plan = plan;
            request_plan.config = &request_config;
            apply_pooled_request(request, request_config, request_plan);
            ResourceLimits deferred;
            deferred.cpu_seconds = request_plan.rlimits.cpu_seconds;
            deferred.open_files = request_plan.rlimits.open_files;
            apply_resource_limits(deferred);
            live = &request_plan;
        } else {
            wait_until_root_ready(std::move(context.ready));
        }
        if (early_failure) throw Error(*early_failure);
        // 7. In the final root: the environment (the image's /etc/environment, --env), the
        //    working directory, and the OOM killer's preference for the payload over init.
        enter_payload_environment(*live->config);
        prefer_payload_for_oom_kill();
        // 8. Landlock: only files beneath the sandbox's root.
        if (plan.landlock_abi > 0) apply_landlock(plan.landlock_abi);
        // 9. Only stdio (and the rc script's descriptor) survive exec.
        close_descriptors_at_exec(rc_fd.get());
        // 10. seccomp last for a profile from a file, which may refuse any step above.
        if (!plan.seccomp_before_root_ready && plan.seccomp) install_seccomp_filter(*plan.seccomp);
    } catch (const Error& e) {
        fail_stage(context.status.get(), kExitSqboxFailure, e.what());
    }
    // 11. The command (or enroot's /etc/rc through the container's shell).
    exec_command(*live, context.status.get(), rc_fd.get());
}

}  // namespace sqbox

#include "runtime/init.h"

#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>

#include "image/squashfs_writer.h"
#include "runtime/cgroups.h"
#include "runtime/mounts.h"
#include "runtime/network.h"
#include "runtime/payload.h"
#include "runtime/rootfs.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/terminal.h"
#include "runtime/user_namespace.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

int64_t to_ns(const timeval& tv) {
    return static_cast<int64_t>(tv.tv_sec) * 1000000000LL + static_cast<int64_t>(tv.tv_usec) * 1000;
}

// getppid() is 0 here (the parent lives outside the pid namespace), so the usual race check after
// PR_SET_PDEATHSIG uses the lifeline pipe instead.
void die_with_supervisor(int lifeline_fd) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw system_error("prctl(PR_SET_PDEATHSIG)");
    // Init runs sqbox's binary inside the sandbox: keep /proc/1/{exe,mem,fd,...} closed to the
    // payload, which runs with the same uid. (execve makes the payload itself dumpable again.)
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    pollfd pfd{lifeline_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) != 0) ::_exit(kExitSqboxFailure);  // EOF/HUP: supervisor already gone
}

// Moves init into the sandbox's cgroup (if it has one) before the payload exists, then makes the
// current cgroup the root of a fresh cgroup namespace: the payload sees "/" and nothing of the
// host's tree. The launcher creates the cgroup meanwhile and sends its join files on `channel`,
// with the limits it holds, which the payload then does not apply as rlimits.
void enter_sandbox_cgroup(int channel, ResourceLimits& rlimits) {
    std::optional<FdMessage> message = receive_fd_message(channel);
    if (!message) throw Error("sqbox's launcher went away");
    if (message->tag == 'e') throw Error(message->text);
    drop_limits_held_by_cgroup(message->text, rlimits);
    for (const UniqueFd& fd : message->fds) {
        if (!write_all(fd.get(), "0", 1)) {
            throw system_error("cannot move into the sandbox's cgroup");
        }
    }
    if (::unshare(CLONE_NEWCGROUP) != 0) throw system_error("unshare(CLONE_NEWCGROUP)");
}

// sqbox run starts init while the supervisor still mounts the image (see InitContext): wait for
// it, then leave the supervisor's mount namespace for a copy of it. EOF means the supervisor
// failed, and its own report says why.
void take_mount_namespace_when_image_ready(int image_ready_fd) {
    char ready = 0;
    if (read_full(image_ready_fd, &ready, 1) != 1) ::_exit(kExitSqboxFailure);
    (void)::close(image_ready_fd);
    if (::unshare(CLONE_NEWNS) != 0) throw system_error("unshare(CLONE_NEWNS)");
}

void prepare_sandbox(const SandboxConfig& config) {
    if (::sethostname(config.hostname.data(), config.hostname.size()) != 0) {
        throw system_error("cannot set the hostname");
    }
    PreparedRoot root = assemble_rootfs(config);
    pivot_into(root.root.get());
}

// Waits until the payload has executed its command (the close-on-exec status pipe reaches EOF)
// or failed to (a report arrives), forwarding signals meanwhile: setting up the payload reads
// image files, and a caller's SIGTERM must not wait for that. SIGCHLD stays pending for
// supervise_payload.
bool wait_for_exec(int exec_fd, pid_t payload, StageReport& failure) {
    sigset_t forwarded = pipeline_signals();
    sigdelset(&forwarded, SIGCHLD);
    UniqueFd signals(::signalfd(-1, &forwarded, SFD_CLOEXEC));
    if (!signals) throw system_error("signalfd");
    for (;;) {
        pollfd fds[2] = {{exec_fd, POLLIN, 0}, {signals.get(), POLLIN, 0}};
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            throw system_error("poll");
        }
        if (fds[1].revents != 0) {
            signalfd_siginfo info{};
            if (::read(signals.get(), &info, sizeof info) == sizeof info) {
                (void)::kill(payload, static_cast<int>(info.ssi_signo));
            }
        }
        if (fds[0].revents != 0) return receive_report(exec_fd, failure);
    }
}

// Waits for the payload, reaping any other process that ends meanwhile (orphans are re-parented
// to us) and forwarding signals sent by the supervisor.
StageReport supervise_payload(pid_t payload) {
    StageReport report;
    for (;;) {
        std::optional<siginfo_t> info = wait_for_signal(std::nullopt);
        if (info->si_signo != SIGCHLD) {
            (void)::kill(payload, info->si_signo);
            continue;
        }
        for (;;) {
            int status = 0;
            rusage usage{};
            pid_t reaped = ::wait4(-1, &status, WNOHANG, &usage);
            if (reaped <= 0) break;
            if (reaped != payload) continue;
            report.payload_finished = 1;
            report.wait_status = status;
            report.exit_status = shell_status(status);
            report.cpu_ns = to_ns(usage.ru_utime) + to_ns(usage.ru_stime);
            report.max_rss_kib = usage.ru_maxrss;
            return report;
        }
    }
}

// The payload's process, as init holds it.
struct PayloadProcess {
    pid_t pid = -1;
    UniqueFd exec_status;  // EOF once the command runs; a StageReport if it could not
    UniqueFd ready;        // started early: where init says the root is ready (kRootReady)
};

// Forks the payload once the root is complete (exec_payload).
PayloadProcess start_payload(const SandboxPlan& plan, int terminal_fd) {
    Pipe exec_status = make_pipe("exec status");
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the payload");
    if (pid == 0) {
        exec_status.read_end.reset();
        exec_payload(plan, exec_status.write_end.get(), terminal_fd);
    }
    return {pid, std::move(exec_status.read_end), UniqueFd()};
}

// Forks the payload before init builds the root (exec_payload_once_root_ready). It keeps nothing
// of init's: not its report, lifeline or channel.
PayloadProcess start_payload_early(const SandboxPlan& plan, const InitContext& context) {
    Pipe exec_status = make_pipe("exec status");
    int ready[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ready) != 0) {
        throw system_error("cannot make the payload's start signal");
    }
    UniqueFd ready_init(ready[0]);
    UniqueFd ready_payload(ready[1]);
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the payload");
    if (pid == 0) {
        exec_status.read_end.reset();
        ready_init.reset();
        for (int fd : {context.report_fd, context.lifeline_fd, plan.channel_fd}) {
            if (fd >= 0) (void)::close(fd);
        }
        exec_payload_once_root_ready(plan, exec_status.write_end.get(), ready_payload.get());
    }
    return {pid, std::move(exec_status.read_end), std::move(ready_init)};
}

}  // namespace

// enroot export: the merged layers, as the sandbox would see them at its root, packed into a new
// image on the host. Nothing runs from the image.
[[noreturn]] void export_root(const InitContext& context, const SandboxConfig& config) {
    try {
        if (config.export_image_path.empty() || config.export_image_path.front() != '/') {
            throw Error("export: the output path must be absolute");
        }
        PreparedRoot root = mount_root_layers(config);
        write_squashfs_image(root.root.get(), std::string(kOldRootDir) + config.export_image_path,
                             {});
    } catch (const Error& e) {
        fail_stage(context.report_fd, kExitSqboxFailure, e.what());
    }
    send_report(context.report_fd, StageReport{});
    ::_exit(0);
}

// sqbox serve: the request's stdio becomes 0-2; everything else the long-lived supervisor holds
// (other sandboxes' pipes, its control socket) is closed.
void adopt_request_stdio(const InitContext& context) {
    const SandboxPlan& plan = *context.plan;
    if (plan.stdio_fds[0] < 0 && !plan.pooled) return;
    if (plan.stdio_fds[0] >= 0) {
        for (int fd = 0; fd < 3; ++fd) {
            if (::dup2(plan.stdio_fds[static_cast<size_t>(fd)], fd) < 0) {
                throw system_error("cannot set up the sandbox's stdio");
            }
        }
    }
    close_fds_except({context.report_fd, context.lifeline_fd, plan.channel_fd});
}

// A pooled sandbox: everything is set up; now the request arrives. Its stdio replaces 0-2, its
// command and additions complete the configuration. The server going away ends the sandbox.
void await_request(int channel, SandboxConfig& config, SandboxPlan& plan) {
    std::optional<FdMessage> message = receive_fd_message(channel);
    if (!message || message->tag != 'g' || message->fds.size() != 3) ::_exit(0);
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(message->fds[static_cast<size_t>(fd)].get(), fd) < 0) {
            throw system_error("cannot set up the sandbox's stdio");
        }
    }
    try {
        const nlohmann::json request = nlohmann::json::parse(message->text);
        config.command = request.at("command").get<std::vector<std::string>>();
        for (const auto& [key, value] :
             request.at("environment").get<std::vector<std::pair<std::string, std::string>>>()) {
            config.environment.emplace_back(key, value);
        }
        config.workdir = request.at("workdir").get<std::string>();
        if (!request.at("cpu_seconds").is_null()) {
            config.limits.cpu_seconds = request.at("cpu_seconds").get<uint64_t>();
            plan.rlimits.cpu_seconds = config.limits.cpu_seconds;
        }
    } catch (const nlohmann::json::exception& e) {
        throw Error(std::string("malformed request from the server: ") + e.what());
    }
}

// The new user namespace needs its id maps before anything else. A process may write its own
// maps only while it is dumpable (the files are root's otherwise); init is not, so it is for the
// moment of writing. Only the caller's own processes could act in that window, and nothing of the
// sandbox exists yet.
void enter_own_user_namespace(const std::pair<uid_t, gid_t>& ids) {
    if (::prctl(PR_SET_DUMPABLE, 1) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    write_own_id_maps({ids.first, ids.second, ids.first, ids.second},
                      std::string(kOldRootDir) + "/proc");
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
}

void run_init(const InitContext& context) {
    const SandboxPlan& plan = *context.plan;
    const SandboxConfig& config = *plan.config;
    try {
        die_with_supervisor(context.lifeline_fd);
        // The image server's record of a learning run is not the sandbox's business.
        if (plan.learn_fd >= 0) (void)::close(plan.learn_fd);
        // Nor is the host directory of the image's unpacked files (the supervisor binds it).
        if (plan.unpacked_files_fd >= 0) (void)::close(plan.unpacked_files_fd);
        if (plan.own_user_namespace) enter_own_user_namespace(*plan.own_user_namespace);
        enter_loopback_only_network();
        if (context.image_ready_fd >= 0) {
            take_mount_namespace_when_image_ready(context.image_ready_fd);
        }
        adopt_request_stdio(context);
        if (!config.export_image_path.empty()) export_root(context, config);
    } catch (const Error& e) {
        fail_stage(context.report_fd, kExitSqboxFailure, e.what());
    }

    StageReport report;
    try {
        SandboxConfig live_config = config;
        SandboxPlan live_plan = plan;
        live_plan.config = &live_config;
        // Before the payload exists, which then starts in the cgroup (and its namespace).
        enter_sandbox_cgroup(plan.channel_fd, live_plan.rlimits);
        std::optional<PayloadProcess> early;
        if (plan.payload_may_start_early && !plan.pooled && !config.tty) {
            // Init stands at the host's directory it was started in; so would the payload, and
            // pivot_root carries along only what stands at the old root.
            if (::chdir("/") != 0) throw system_error("chdir /");
            early = start_payload_early(live_plan, context);
        }
        try {
            prepare_sandbox(config);
        } catch (const Error& e) {
            fail_stage(context.report_fd, kExitSqboxFailure, e.what());  // the payload dies with us
        }
        if (plan.pooled) await_request(plan.channel_fd, live_config, live_plan);
        SandboxPty terminal;
        if (config.tty) {
            terminal = open_sandbox_pty();
            send_fd_message(plan.channel_fd, 't', {}, {terminal.master.get()},
                            "--tty: cannot pass the terminal to sqbox");
            terminal.master.reset();
        }
        (void)::close(plan.channel_fd);
        const auto started = Clock::now();
        PayloadProcess payload =
            early ? std::move(*early) : start_payload(live_plan, terminal.slave.get());
        terminal.slave.reset();
        if (payload.ready) {
            // If this fails the payload has already failed, and its report says why.
            (void)::send(payload.ready.get(), &kRootReady, 1, MSG_NOSIGNAL);
            payload.ready.reset();
        }
        StageReport exec_failure;
        const bool exec_failed =
            wait_for_exec(payload.exec_status.get(), payload.pid, exec_failure);
        if (!exec_failed) {
            // Early word that the payload runs: if the sandbox is killed before the final report
            // (a timeout), the record still says it started.
            StageReport running;
            running.payload_started = 1;
            send_report(context.report_fd, running);
        }

        report = supervise_payload(payload.pid);
        report.wall_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count();
        if (exec_failed) {
            report.exit_status = exec_failure.exit_status;
            report.set_error(exec_failure.error_message());
        } else {
            report.payload_started = 1;
        }
    } catch (const Error& e) {
        print_error(e.what());
        report.exit_status = kExitSqboxFailure;
        report.set_error(e.what());
    }
    send_report(context.report_fd, report);
    ::_exit(0);
}

}  // namespace sqbox

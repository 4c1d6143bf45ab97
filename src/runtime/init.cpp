#include "runtime/init.h"

#include <fcntl.h>
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

}  // namespace

void die_with_supervisor(int lifeline_fd) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw system_error("prctl(PR_SET_PDEATHSIG)");
    // Init runs sqbox's binary inside the sandbox: keep /proc/1/{exe,mem,fd,...} closed to the
    // payload, which runs with the same uid. (execve makes the payload itself dumpable again.)
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    pollfd pfd{lifeline_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) != 0) ::_exit(kExitSqboxFailure);  // EOF/HUP: supervisor already gone
}

void enter_sandbox_cgroup(int channel, ResourceLimits& rlimits) {
    std::optional<FdMessage> message = receive_fd_message(channel);
    if (!message) throw Error("sqbox's launcher went away");
    if (message->tag == MessageTag::kFailed) throw Error(message->text);
    drop_limits_held_by_cgroup(message->text, rlimits);
    for (const UniqueFd& fd : message->fds) {
        if (!write_all(fd.get(), "0", 1)) {
            throw system_error("cannot move into the sandbox's cgroup");
        }
    }
    if (::unshare(CLONE_NEWCGROUP) != 0) throw system_error("unshare(CLONE_NEWCGROUP)");
}

void take_mount_namespace_when_image_ready(UniqueFd image_ready) {
    char ready = 0;
    if (read_full(image_ready.get(), &ready, 1) != 1) ::_exit(kExitSqboxFailure);
    image_ready.reset();
    if (::unshare(CLONE_NEWNS) != 0) throw system_error("unshare(CLONE_NEWNS)");
}

void prepare_sandbox(const SandboxConfig& config) {
    if (::sethostname(config.hostname.data(), config.hostname.size()) != 0) {
        throw system_error("cannot set the hostname");
    }
    PreparedRoot root = assemble_rootfs(config);
    pivot_into(root.root.get());
}

namespace {

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

}  // namespace

InitContext take_init_context(const SandboxPlan& plan, Pipe& report, Pipe& lifeline,
                              UniqueFd channel) {
    report.read_end.reset();
    lifeline.write_end.reset();
    InitContext context;
    context.plan = &plan;
    context.report = std::move(report.write_end);
    context.lifeline = std::move(lifeline.read_end);
    context.channel = std::move(channel);
    return context;
}

void keep_only_init_descriptors(const InitContext& context) {
    close_fds_except({context.report.get(), context.lifeline.get(), context.image_ready.get(),
                      context.channel.get(), diagnostics_fd(), context.stdio[0].get(),
                      context.stdio[1].get(), context.stdio[2].get()});
}

PayloadProcess start_payload(const SandboxPlan& plan, UniqueFd terminal) {
    Pipe exec_status = make_pipe("exec status");
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the payload");
    if (pid == 0) {
        close_fds_except({exec_status.write_end.get(), terminal.get(), diagnostics_fd()});
        PayloadContext payload;
        payload.plan = &plan;
        payload.status = std::move(exec_status.write_end);
        payload.terminal = std::move(terminal);
        run_payload(std::move(payload));
    }
    return {pid, std::move(exec_status.read_end), UniqueFd()};
}

// Forks the payload before init builds the root. It keeps nothing of init's: not its report,
// lifeline or channel.
PayloadProcess start_payload_early(const SandboxPlan& plan) {
    // Init stands at the host's directory it was started in; so would the payload, and
    // pivot_root carries along only what stands at the old root.
    if (::chdir("/") != 0) throw system_error("chdir /");
    Pipe exec_status = make_pipe("exec status");
    // A message channel: a pooled sandbox's request comes this way, with its stdio.
    std::pair<UniqueFd, UniqueFd> ready = make_message_channel("the payload's start signal");
    UniqueFd ready_init = std::move(ready.first);
    UniqueFd ready_payload = std::move(ready.second);
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the payload");
    if (pid == 0) {
        close_fds_except({exec_status.write_end.get(), ready_payload.get(), diagnostics_fd()});
        PayloadContext payload;
        payload.plan = &plan;
        payload.status = std::move(exec_status.write_end);
        payload.ready = std::move(ready_payload);
        run_payload(std::move(payload));
    }
    return {pid, std::move(exec_status.read_end), std::move(ready_init)};
}

void export_root(const InitContext& context, const SandboxConfig& config) {
    try {
        if (config.export_image_path.empty() || config.export_image_path.front() != '/') {
            throw Error("export: the output path must be absolute");
        }
        PreparedRoot root = mount_root_layers(config);
        // What the container added or changed cannot become setuid or setgid in the image: those
        // bits stay only on files the image itself has so, unchanged (SECURITY.md, "export").
        UniqueFd image(::open(kImageDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!image) throw system_error(std::string("cannot open the image at ") + kImageDir);
        SquashfsWriteOptions options;
        options.setid_reference_fd = image.get();
        const SquashfsWriteSummary summary = write_squashfs_image(
            root.root.get(), std::string(kOldRootDir) + config.export_image_path, options);
        if (!summary.setid_dropped.empty()) {
            std::string paths;
            for (size_t i = 0; i < summary.setid_dropped.size() && i < 5; ++i) {
                paths += (i ? ", /" : "/") + summary.setid_dropped[i];
            }
            if (summary.setid_dropped.size() > 5) paths += ", ...";
            print_error("export: dropped the setuid/setgid bits of " +
                        std::to_string(summary.setid_dropped.size()) +
                        " file(s) that the image does not have so: " + paths);
        }
    } catch (const Error& e) {
        fail_stage(context.report.get(), kExitSqboxFailure, e.what());
    }
    send_report(context.report.get(), StageReport{});
    ::_exit(0);
}

void adopt_request_stdio(InitContext& context) {
    for (int fd = 0; fd < 3; ++fd) {
        UniqueFd& source = context.stdio.at(static_cast<size_t>(fd));
        if (!source) continue;
        if (::dup2(source.get(), fd) < 0) throw system_error("cannot set up the sandbox's stdio");
        if (source.get() == fd) {
            (void)source.release();  // it already was in its place: 0-2 are not closed
        } else {
            source.reset();
        }
    }
    // Nothing else of the server's is open: keep_only_init_descriptors closed it on entry.
}

void hand_mount_namespace_to_supervisor(int channel) {
    // The host's procfs is still at the old root; /proc/self there is this process.
    const std::string path = std::string(kOldRootDir) + "/proc/self/ns/mnt";
    UniqueFd mounts(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!mounts) throw system_error("cannot open " + path);
    send_fd_message(channel, MessageTag::kMountNamespace, "", {mounts.get()},
                    "cannot hand the mount namespace to the supervisor");
}

std::string await_request(int channel, SandboxConfig& config, SandboxPlan& plan) {
    std::optional<FdMessage> message = receive_fd_message(channel);
    if (!is_request_with_stdio(message)) ::_exit(0);
    install_request_stdio(*message);
    apply_pooled_request(message->text, config, plan);
    return std::move(message->text);
}

void apply_pooled_request(const std::string& text, SandboxConfig& config, SandboxPlan& plan) {
    try {
        const nlohmann::json request = nlohmann::json::parse(text);
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

bool starts_payload_early(const SandboxPlan& plan) {
    return plan.seccomp_before_root_ready && !plan.config->tty;
}

SandboxPty open_terminal_if_asked(const SandboxConfig& config, int channel) {
    SandboxPty terminal;
    if (!config.tty) return terminal;
    terminal = open_sandbox_pty();
    send_fd_message(channel, MessageTag::kTerminal, {}, {terminal.master.get()},
                    "--tty: cannot pass the terminal to sqbox");
    terminal.master.reset();
    return terminal;
}

void release_early_payload(PayloadProcess& payload, const std::optional<std::string>& request) {
    if (!payload.ready) return;
    // If this fails the payload has already failed, and its report says why.
    if (request) {
        try {
            send_fd_message(payload.ready.get(), MessageTag::kGo, *request,
                            {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}, "the request");
        } catch (const Error&) {
        }
    } else {
        (void)::send(payload.ready.get(), &kRootReady, 1, MSG_NOSIGNAL);
    }
    payload.ready.reset();
}

StageReport supervise_payload_to_end(PayloadProcess& payload, int report_fd,
                                     std::chrono::steady_clock::time_point started) {
    StageReport exec_failure;
    const bool exec_failed = wait_for_exec(payload.exec_status.get(), payload.pid, exec_failure);
    if (!exec_failed) {
        // Early word that the payload runs: if the sandbox is killed before the final report
        // (a timeout), the record still says it started.
        StageReport running;
        running.payload_started = 1;
        send_report(report_fd, running);
    }
    StageReport report = supervise_payload(payload.pid);
    report.wall_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count();
    if (exec_failed) {
        report.exit_status = exec_failure.exit_status;
        report.image_server_lost = exec_failure.image_server_lost;
        report.set_error(exec_failure.error_message());
    } else {
        report.payload_started = 1;
    }
    return report;
}

}  // namespace sqbox

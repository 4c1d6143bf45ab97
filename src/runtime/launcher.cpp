// The launcher's steps (runtime/launcher.h); their order is in runtime/pipeline.cpp.
#include "runtime/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "runtime/signals.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"

namespace sqbox {
namespace {

void fill_result(const StageReport& report, RunResult& result) {
    result.exit_status = report.exit_status;
    result.timed_out = report.timed_out != 0;
    result.payload_started = report.payload_started != 0;
    result.wall_ms = static_cast<double>(report.wall_ns) / 1e6;
    result.cpu_ms = static_cast<double>(report.cpu_ns) / 1e6;
    result.peak_rss_bytes = static_cast<uint64_t>(report.max_rss_kib) * 1024;
    result.error = report.error_message();
    if (report.payload_finished && result.payload_started && !result.timed_out) {
        if (WIFEXITED(report.wait_status)) {
            result.payload_exit_code = WEXITSTATUS(report.wait_status);
        }
        if (WIFSIGNALED(report.wait_status)) result.signal = WTERMSIG(report.wait_status);
    }
    if (result.timed_out) result.signal = SIGKILL;
}

std::optional<double> as_number(const std::optional<uint64_t>& value) {
    if (!value) return std::nullopt;
    return static_cast<double>(*value);
}

// Which mechanism holds each limit. RLIMIT_NPROC counts per user, and the kernel exempts the
// host's root user from it: a root caller without a cgroup has no process limit at all.
std::vector<AppliedLimit> describe_limits(const SandboxConfig& config,
                                          const SandboxCgroup* cgroup) {
    const ResourceLimits& limits = config.limits;
    auto by = [&](bool in_cgroup, bool set, const char* fallback) -> std::string {
        if (!set) return "none";
        if (cgroup != nullptr && in_cgroup) return cgroup->mechanism();
        return fallback;
    };
    const bool root = ::geteuid() == 0;
    return {
        {"memory", as_number(limits.memory_bytes),
         by(cgroup != nullptr && cgroup->limits_memory(), limits.memory_bytes.has_value(),
            "rlimit")},
        {"pids", as_number(limits.processes),
         by(cgroup != nullptr && cgroup->limits_processes(), limits.processes.has_value(),
            root ? "none" : "rlimit")},
        {"cpus", limits.cpus, by(true, limits.cpus.has_value(), "none")},
        {"cpu_time", as_number(limits.cpu_seconds),
         by(false, limits.cpu_seconds.has_value(), "rlimit")},
        {"file_size", as_number(limits.file_size_bytes),
         by(false, limits.file_size_bytes.has_value(), "rlimit")},
        {"open_files", as_number(limits.open_files),
         by(false, limits.open_files.has_value(), "rlimit")},
        // Each stream's cap, where it goes to neither a terminal nor /dev/null.
        {"output", as_number(config.output_limit_bytes),
         config.output_limit_bytes ? "sqbox" : "none"},
        {"writable", static_cast<double>(config.tmpfs_size_bytes), "tmpfs"},
    };
}

// Whether the sandbox's cgroup is decided before the sandbox starts. Finding it means reading the
// mount table (a few hundred microseconds), so the plain root run does that while the supervisor
// sets the sandbox up; options the cgroup may refuse are checked first, so that they fail before
// any namespace exists, and --verbose names each limit's mechanism up front.
bool cgroup_decided_first(const SandboxConfig& config) {
    return !config.cgroup_parent.empty() || config.limits.cpus || config.verbose;
}

}  // namespace

std::optional<SandboxCgroup> plan_cgroup_before_start(const SandboxConfig& config) {
    if (!cgroup_decided_first(config)) return std::nullopt;
    return SandboxCgroup::plan(config);
}

SandboxPlan plan_run(const SandboxConfig& config, const SandboxCgroup* cgroup) {
    // Resolved in the sandbox's root, never against a directory the payload inherits.
    if (config.workdir.empty() || config.workdir.front() != '/') {
        throw Error("the working directory must be an absolute path in the sandbox, not '" +
                    config.workdir + "'");
    }
    SandboxPlan plan = build_sandbox_plan(config);
    if (config.limits.cpus && (cgroup == nullptr || !cgroup->limits_cpu())) {
        throw Error(
            "--cpus needs a cgroup with the cpu controller: run as root, or pass --cgroup DIR "
            "(a cgroup v2 directory delegated to you)");
    }
    if (config.proc_view == SandboxConfig::ProcView::kOuter) {
        // The payload sees the caller's processes; Landlock is what keeps it from reading their
        // memory and environment (ptrace access to processes outside its domain), and a profile
        // of sqbox's own what keeps it from new user namespaces (the caller's /proc/sys, where
        // sqbox would set max_user_namespaces to 0, is read-only in a container).
        if (plan.landlock_abi == 0) {
            throw Error(
                "--proc outer needs Landlock (this kernel has none): without it the payload "
                "could read your processes' memory");
        }
        if (config.seccomp_profile != "default" && config.seccomp_profile != "strict") {
            throw Error(
                "--proc outer needs --seccomp default or strict (they refuse new user "
                "namespaces, which sqbox cannot limit through your /proc)");
        }
    }
    if (config.verbose) {
        if (config.proc_view == SandboxConfig::ProcView::kOuter) {
            print_error(
                "proc: your own /proc (--proc outer): the payload sees your processes' ids, "
                "command lines and status, not their memory, environment or files");
        }
        if (plan.seccomp) {
            print_error("seccomp: profile " + config.seccomp_profile + ", " +
                        std::to_string(plan.seccomp->rules_applied) + " rules, " +
                        std::to_string(plan.seccomp->program.size()) + " BPF instructions");
        }
        print_error(plan.landlock_abi > 0
                        ? "landlock: applied (ABI " + std::to_string(plan.landlock_abi) +
                              "): the payload can reach only files beneath the sandbox's root"
                        : std::string("landlock: not applied (this kernel has no Landlock)"));
        for (const auto& limit : describe_limits(config, cgroup)) {
            if (limit.value) {
                char value[32];
                (void)std::snprintf(value, sizeof value, "%.15g", *limit.value);
                print_error("limit " + limit.name + " = " + value + ": enforced by " +
                            limit.enforced_by);
            }
        }
    }
    return plan;
}

void hand_over_cgroup(const SandboxConfig& config, std::optional<SandboxCgroup>& cgroup,
                      int channel) {
    std::vector<int> join_fds;
    MessageTag tag = MessageTag::kCgroup;
    std::string text;
    try {
        if (!cgroup_decided_first(config)) cgroup = SandboxCgroup::plan(config);
        if (cgroup) {
            cgroup->create();
            join_fds = cgroup->join_fds();
            text = cgroup_held_limits(*cgroup);
        }
    } catch (const Error& e) {
        tag = MessageTag::kFailed;
        text = e.what();
        join_fds.clear();
    }
    try {
        send_fd_message(channel, tag, text, join_fds, "cannot hand the cgroup to the sandbox");
    } catch (const Error&) {
        // The sandbox is already gone; its report says why.
    }
}

ScopedIgnoreSigpipe::ScopedIgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    (void)::sigaction(SIGPIPE, &ignore, &previous_);
}

ScopedIgnoreSigpipe::~ScopedIgnoreSigpipe() {
    (void)::sigaction(SIGPIPE, &previous_, nullptr);
}

Supervision supervise(ChildProcess& supervisor, StdioRelay& relay, int report_fd,
                      const std::function<void()>& sandbox_gone) {
    sigset_t signals = pipeline_signals();
    // SIGWINCH too (--tty), blocked only here: the children were started without it blocked.
    sigset_t winch;
    sigemptyset(&winch);
    sigaddset(&winch, SIGWINCH);
    sigaddset(&signals, SIGWINCH);
    sigset_t previous;
    if (::sigprocmask(SIG_BLOCK, &winch, &previous) != 0) throw system_error("sigprocmask");
    struct RestoreMask {
        sigset_t mask;
        ~RestoreMask() { (void)::sigprocmask(SIG_SETMASK, &mask, nullptr); }
    } restore{previous};
    UniqueFd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC));
    if (!signal_fd) throw system_error("signalfd");
    std::optional<int> status;
    Supervision supervision;
    bool report_open = true;
    std::vector<pollfd> fds;
    for (;;) {
        fds.assign({{signal_fd.get(), POLLIN, 0}, {report_open ? report_fd : -1, POLLIN, 0}});
        relay.add_to_poll(fds);
        // Once the supervisor is gone, so is every process that could write to the relay (they
        // all die with it): what is left is output already on its way.
        if (status && relay.output_done()) break;
        if (::poll(fds.data(), fds.size(), -1) < 0) {
            if (errno == EINTR) continue;
            throw system_error("poll");
        }
        if (fds[0].revents != 0) {
            signalfd_siginfo info{};
            if (::read(signal_fd.get(), &info, sizeof info) == sizeof info) {
                const auto signal = static_cast<int>(info.ssi_signo);
                if (is_forwarded_signal(signal)) {
                    // After the sandbox is gone, a caller who stopped reading and signals us
                    // gets us gone instead of waiting for output nobody takes.
                    if (status) relay.abandon_output();
                    supervisor.send(signal);
                }
                if (signal == SIGWINCH) relay.resize();
            }
            if (!status && (status = supervisor.try_reap())) relay.stop_input();
        }
        if (fds[1].revents != 0) {
            // The report is written in one piece (smaller than PIPE_BUF), so it is all there.
            StageReport report;
            if (receive_report(report_fd, report)) {
                supervision.report = report;
                sandbox_gone();
            }
            report_open = false;
        }
        relay.handle_poll(fds);
    }
    StageReport report;
    if (report_open && receive_report(report_fd, report)) {  // written before the supervisor exited
        supervision.report = report;
        sandbox_gone();
    }
    supervision.status = *status;
    return supervision;
}

RunResult result_of(const Supervision& supervision, const StdioRelay& relay,
                    const SandboxConfig& config, const SandboxPlan& plan,
                    const SandboxCgroup* cgroup, bool oom_killed) {
    if (!supervision.report) {
        throw Error("sandbox supervisor died unexpectedly (status " +
                    std::to_string(shell_status(supervision.status)) + ")");
    }
    RunResult result;
    result.seccomp = config.seccomp_profile;
    fill_result(*supervision.report, result);
    result.stdout_truncated = relay.stdout_truncated();
    result.stderr_truncated = relay.stderr_truncated();
    result.limits = describe_limits(config, cgroup);
    result.landlock_abi = plan.landlock_abi;
    result.proc = config.proc_view == SandboxConfig::ProcView::kOuter ? "outer" : "fresh";
    if (result.stdout_truncated || result.stderr_truncated) {
        const char* streams = !result.stderr_truncated   ? "stdout"
                              : !result.stdout_truncated ? "stderr"
                                                         : "stdout and stderr";
        print_error(std::string("output truncated: ") + streams + " passed --output-limit (" +
                    std::to_string(config.output_limit_bytes.value_or(0)) +
                    " bytes); the rest was discarded");
    }
    if (oom_killed) {
        result.oom_killed = true;
        print_error(
            "out of memory: the sandbox reached its memory limit and the kernel "
            "killed a process in it");
    }
    return result;
}

RunResult stopped_before_start(const SandboxConfig& config, int signal) {
    const char* name = ::sigabbrev_np(signal);
    RunResult result;
    result.seccomp = config.seccomp_profile;
    result.exit_status = kExitSignalBase + signal;
    result.error = std::string("stopped by SIG") + (name != nullptr ? name : "?") +
                   " before the sandbox started: nothing ran";
    print_error(result.error);
    return result;
}

}  // namespace sqbox

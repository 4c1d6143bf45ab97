// The launcher: the caller's own process. It opens everything that needs the caller's view of the
// host (the image, /dev/fuse, the sandbox's cgroup), compiles the security policy, creates the
// supervisor in a new user namespace, relays stdio where needed, forwards signals to it and turns
// its report into a RunResult.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "image/image_source.h"
#include "runtime/cgroups.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/stdio_relay.h"
#include "runtime/supervisor.h"
#include "security/landlock.h"
#include "security/seccomp_choice.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"
#include "warm_up/warm_up.h"

namespace sqbox {
namespace {

// The supervisor opens /dev/fuse itself (the kernel wants the device opened in the user
// namespace that mounts it); checking here gives the clear error before any namespace exists.
void check_fuse_device() {
    if (::access("/dev/fuse", R_OK | W_OK) != 0) {
        throw system_error(
            "cannot use /dev/fuse (needed to mount .sqsh images; it must exist "
            "and be read-writable by you, mode 0666 on standard systems)");
    }
}

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
std::vector<AppliedLimit> describe_limits(const ResourceLimits& limits,
                                          const SandboxCgroup* cgroup) {
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
    };
}

// Decides everything that does not need the sandbox yet, so bad settings fail before any
// namespace exists.
SandboxPlan make_plan(const SandboxConfig& config, const SandboxCgroup* cgroup) {
    // Resolved in the sandbox's root, never against a directory the payload inherits.
    if (config.workdir.empty() || config.workdir.front() != '/') {
        throw Error("the working directory must be an absolute path in the sandbox, not '" +
                    config.workdir + "'");
    }
    SandboxPlan plan;
    plan.config = &config;
    plan.seccomp = prepare_seccomp(config.seccomp_profile);
    plan.landlock_abi = landlock_abi_version();
    plan.payload_may_start_early = allows_early_payload_start(config.seccomp_profile);
    // Init drops the ones the sandbox's cgroup holds when it joins (hand_over_cgroup).
    plan.rlimits = config.limits;
    if (config.limits.cpus && (cgroup == nullptr || !cgroup->limits_cpu())) {
        throw Error(
            "--cpus needs a cgroup with the cpu controller: run as root, or pass --cgroup DIR "
            "(a cgroup v2 directory delegated to you)");
    }
    if (config.verbose) {
        if (plan.seccomp) {
            print_error("seccomp: profile " + config.seccomp_profile + ", " +
                        std::to_string(plan.seccomp->rules_applied) + " rules, " +
                        std::to_string(plan.seccomp->program.size()) + " BPF instructions");
        }
        print_error(plan.landlock_abi > 0
                        ? "landlock: applied (ABI " + std::to_string(plan.landlock_abi) +
                              "): the payload can reach only files beneath the sandbox's root"
                        : std::string("landlock: not applied (this kernel has no Landlock)"));
        for (const auto& limit : describe_limits(config.limits, cgroup)) {
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

// Whether the sandbox's cgroup is decided before the sandbox starts. Finding it means reading the
// mount table (a few hundred microseconds), so the plain root run does that while the supervisor
// sets the sandbox up; options the cgroup may refuse are checked first, so that they fail before
// any namespace exists, and --verbose names each limit's mechanism up front.
bool cgroup_decided_first(const SandboxConfig& config) {
    return !config.cgroup_parent.empty() || config.limits.cpus || config.verbose;
}

// Decides (unless decided first) and creates the sandbox's cgroup while the supervisor and init
// set the sandbox up, and sends init the files that move it in, with the limits it holds. A
// failure goes to init as text: init reports it (one line, 125).
void hand_over_cgroup(const SandboxConfig& config, std::optional<SandboxCgroup>& cgroup,
                      int channel) {
    std::vector<int> join_fds;
    char tag = 'c';
    std::string text;
    try {
        if (!cgroup_decided_first(config)) cgroup = SandboxCgroup::plan(config);
        if (cgroup) {
            cgroup->create();
            join_fds = cgroup->join_fds();
            text = cgroup_held_limits(*cgroup);
        }
    } catch (const Error& e) {
        tag = 'e';
        text = e.what();
        join_fds.clear();
    }
    try {
        send_fd_message(channel, tag, text, join_fds, "cannot hand the cgroup to the sandbox");
    } catch (const Error&) {
        // The sandbox is already gone; its report says why.
    }
}

// Restores SIGPIPE's disposition on scope exit; while relaying, a payload that closes its stdin
// must give the launcher EPIPE, not kill it.
class ScopedIgnoreSigpipe {
  public:
    ScopedIgnoreSigpipe() {
        struct sigaction ignore {};
        ignore.sa_handler = SIG_IGN;
        (void)::sigaction(SIGPIPE, &ignore, &previous_);
    }
    ~ScopedIgnoreSigpipe() { (void)::sigaction(SIGPIPE, &previous_, nullptr); }
    ScopedIgnoreSigpipe(const ScopedIgnoreSigpipe&) = delete;
    ScopedIgnoreSigpipe& operator=(const ScopedIgnoreSigpipe&) = delete;

  private:
    struct sigaction previous_ {};
};

// What supervise() saw: the supervisor's wait status and, if it sent one, its final report.
struct Supervision {
    int status = 0;
    std::optional<StageReport> report;
};

// Forwards signals to the supervisor and relays stdio until the supervisor has exited and all
// relayed output is drained. The supervisor reports once init is gone, before it tears down its
// own mounts: `sandbox_gone` runs then, so that work overlaps with that teardown.
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

}  // namespace

RunResult run_sandbox(const SandboxConfig& config) {
    RunResult result;
    result.seccomp = config.seccomp_profile;
    try {
        ImageSource image = open_image(config.image);
        if (image.kind == ImageSource::Kind::kSquashfs) check_fuse_device();
        std::optional<SandboxCgroup> cgroup;
        if (cgroup_decided_first(config)) cgroup = SandboxCgroup::plan(config);
        SandboxPlan plan = make_plan(config, cgroup ? &*cgroup : nullptr);
        WarmUp warm_up(config, image);
        plan.learn_fd = warm_up.learn_fd();
        plan.unpacked_files_tree = warm_up.unpacked_files_tree();
        plan.unpacked_files_fd = warm_up.unpacked_files_fd();
        Pipe report_pipe = make_pipe("supervisor report");
        auto [channel, init_channel] = make_message_channel("the sandbox's channel");
        plan.channel_fd = init_channel.get();
        StdioRelay relay(config.output_limit_bytes, config.tty, channel.get());
        std::optional<ScopedIgnoreSigpipe> ignore_sigpipe;
        if (relay.active()) ignore_sigpipe.emplace();

        ScopedSignalBlock block;
        const pid_t self = ::getpid();
        pid_t pid = clone_process(CLONE_NEWUSER | CLONE_NEWNS, "the sandbox's user namespace");
        if (pid == 0) {
            report_pipe.read_end.reset();
            channel.reset();
            if (relay.active()) {
                plan.diagnostics_fd = relay.install_in_child();
                set_diagnostics_fd(plan.diagnostics_fd);
            }
            run_supervisor({&plan, &image, report_pipe.write_end.get(), self, &warm_up.names()});
        }
        ChildProcess supervisor(pid);
        report_pipe.write_end.reset();
        relay.close_child_ends();
        init_channel.reset();
        hand_over_cgroup(config, cgroup, channel.get());

        bool oom_killed = false;
        auto clean_up_cgroup = [&] {
            if (!cgroup) return;
            oom_killed = cgroup->oom_killed();
            cgroup->remove();
        };
        Supervision supervision =
            supervise(supervisor, relay, report_pipe.read_end.get(), clean_up_cgroup);
        if (!supervision.report) {
            throw Error("sandbox supervisor died unexpectedly (status " +
                        std::to_string(shell_status(supervision.status)) + ")");
        }
        const StageReport& report = *supervision.report;
        fill_result(report, result);
        warm_up.save_learned();
        result.stdout_truncated = relay.stdout_truncated();
        result.stderr_truncated = relay.stderr_truncated();
        result.limits = describe_limits(config.limits, cgroup ? &*cgroup : nullptr);
        result.landlock_abi = plan.landlock_abi;
        if (oom_killed) {
            result.oom_killed = true;
            print_error(
                "out of memory: the sandbox reached its memory limit and the kernel "
                "killed a process in it");
        }
    } catch (const Error& e) {
        print_error(e.what());
        const std::string seccomp = result.seccomp;
        result = RunResult{};
        result.seccomp = seccomp;
        result.exit_status = kExitSqboxFailure;
        result.error = e.what();
    }
    return result;
}

}  // namespace sqbox

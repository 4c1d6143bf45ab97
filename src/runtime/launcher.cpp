// The launcher: the caller's own process. It opens everything that needs the caller's view of the
// host (the image, /dev/fuse), creates the supervisor in a new user namespace, forwards signals
// to it and turns its report into a RunResult.
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "image/image_source.h"
#include "runtime/process.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/supervisor.h"
#include "security/landlock.h"
#include "security/seccomp_choice.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/files.h"

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
        if (WIFEXITED(report.wait_status))
            result.payload_exit_code = WEXITSTATUS(report.wait_status);
        if (WIFSIGNALED(report.wait_status)) result.signal = WTERMSIG(report.wait_status);
    }
    if (result.timed_out) result.signal = SIGKILL;
}

// Decides everything that does not need the sandbox yet, so bad settings fail before any
// namespace exists.
SandboxPlan make_plan(const SandboxConfig& config) {
    SandboxPlan plan;
    plan.config = &config;
    plan.seccomp = prepare_seccomp(config.seccomp_profile);
    plan.landlock_abi = landlock_abi_version();
    plan.rlimits = config.limits;
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
    }
    return plan;
}

}  // namespace

RunResult run_sandbox(const SandboxConfig& config) {
    RunResult result;
    try {
        ImageSource image = open_image(config.image);
        SandboxPlan plan = make_plan(config);
        if (image.kind == ImageSource::Kind::kSquashfs) check_fuse_device();
        Pipe report_pipe = make_pipe("supervisor report");

        ScopedSignalBlock block;
        const pid_t self = ::getpid();
        pid_t pid = clone_process(CLONE_NEWUSER | CLONE_NEWNS, "the sandbox's user namespace");
        if (pid == 0) {
            report_pipe.read_end.reset();
            run_supervisor({&plan, &image, report_pipe.write_end.get(), self});
        }
        ChildProcess supervisor(pid);
        report_pipe.write_end.reset();

        std::optional<int> supervisor_status;
        while (!supervisor_status) {
            siginfo_t info = *wait_for_signal(std::nullopt);
            if (is_forwarded_signal(info.si_signo)) {
                supervisor.send(info.si_signo);
            } else {
                supervisor_status = supervisor.try_reap();
            }
        }
        StageReport report;
        if (!receive_report(report_pipe.read_end.get(), report)) {
            throw Error("sandbox supervisor died unexpectedly (status " +
                        std::to_string(shell_status(*supervisor_status)) + ")");
        }
        fill_result(report, result);
    } catch (const Error& e) {
        print_error(e.what());
        result = RunResult{};
        result.exit_status = kExitSqboxFailure;
        result.error = e.what();
    }
    return result;
}

}  // namespace sqbox

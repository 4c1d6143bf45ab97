#include "runtime/supervisor.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <vector>

#include "image/squashfs_server.h"
#include "runtime/init.h"
#include "runtime/payload.h"
#include "runtime/rootfs.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/user_namespace.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"
#include "warm_up/warm_up.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

// How long a learning run waits for the warm-up of the list it started with.
constexpr auto kLearningWarmUpWait = std::chrono::seconds(2);

std::string format_seconds(double seconds) {
    char buffer[32];
    (void)std::snprintf(buffer, sizeof buffer, "%g", seconds);
    return buffer;
}

}  // namespace

IdMapping map_ids_and_seal(const SandboxConfig& config) {
    const IdMapping ids{config.map_root ? 0 : config.outside_uid,
                        config.map_root ? 0 : config.outside_gid, config.outside_uid,
                        config.outside_gid};
    write_own_id_maps(ids);
    // Not dumpable (only now: it makes /proc/self/uid_map root-owned): nothing at the caller's
    // uid may ptrace the supervisor or open its /proc/<pid>/mem, fd, ...
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    return ids;
}

ChildProcess mount_image_and_serve(const ImageSource& image, const IdMapping& ids,
                                   const std::vector<int>& close_in_server, int learn_fd) {
    UniqueFd fuse;
    if (image.kind == ImageSource::Kind::kSquashfs) {
        fuse.reset(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
        if (!fuse) throw system_error("cannot open /dev/fuse");
    }
    enter_scratch_root();
    mount_image(image, fuse.get(), ids);
    if (image.kind != ImageSource::Kind::kSquashfs) return {};

    const pid_t self = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the image server");
    if (pid == 0) {
        die_with_parent(self);
        for (int fd : close_in_server) {
            if (fd >= 0) (void)::close(fd);
        }
        const std::unique_ptr<ImageAccessRecorder> recorder = make_learning_recorder(learn_fd);
        int status = serve_squashfs(image.squashfs.get(), fuse.get(),
                                    {ids.inside_uid, ids.inside_gid, kImageDir, recorder.get()});
        ::_exit(status == 0 ? 0 : kExitSqboxFailure);
    }
    return ChildProcess(pid);  // `fuse` closes here: the server holds the connection now
}

void run_supervisor(const SupervisorContext& context) {
    const SandboxPlan& plan = *context.plan;
    const SandboxConfig& config = *plan.config;
    const ImageSource& image = *context.image;
    try {
        die_with_parent(context.launcher_pid);
        // Out of the caller's process group: terminal signals reach only the launcher, which
        // forwards them exactly once.
        if (::setpgid(0, 0) != 0) throw system_error("setpgid");
        std::vector<int> keep = {image.file.get(), context.report_fd};
        for (int fd :
             {plan.diagnostics_fd, plan.channel_fd, plan.learn_fd, plan.unpacked_files_fd}) {
            if (fd >= 0) keep.push_back(fd);
        }
        close_fds_except(keep);

        const IdMapping ids = map_ids_and_seal(config);

        // Init starts before the image is mounted, still in this mount namespace, so that the
        // network namespace it creates first is built while the image is mounted here.
        Pipe init_report = make_pipe("init report");
        Pipe lifeline = make_pipe("lifeline");
        // A socket rather than a pipe: if init is already gone, the send fails instead of
        // killing this process with SIGPIPE, and init's own report says what happened.
        auto [image_ready, init_image_ready] = make_message_channel("the image-ready channel");
        const auto started = Clock::now();
        pid_t init_pid = clone_process(kSandboxNamespaces & ~CLONE_NEWNS, "sandbox namespaces");
        if (init_pid == 0) {
            init_report.read_end.reset();
            lifeline.write_end.reset();
            image_ready.reset();
            run_init({&plan, init_report.write_end.get(), lifeline.read_end.get(),
                      init_image_ready.get()});
        }
        ChildProcess init(init_pid);
        init_report.write_end.reset();
        lifeline.read_end.reset();
        init_image_ready.reset();

        ChildProcess server = mount_image_and_serve(
            image, ids,
            {context.report_fd, plan.channel_fd, init_report.read_end.get(),
             lifeline.write_end.get(), image_ready.get(), plan.unpacked_files_fd},
            plan.learn_fd);
        // The server has its own copy of the learning run's record file.
        if (plan.learn_fd >= 0) (void)::close(plan.learn_fd);
        // The unpacked files go above the image before init builds the sandbox's root on it
        // (it waits for image_ready), and the warm-up reads what the sandbox will read.
        std::string warm_up_root = kImageDir;
        if (image.kind == ImageSource::Kind::kSquashfs && plan.unpacked_files_fd >= 0) {
            warm_up_root = mount_unpacked_files(plan.unpacked_files_tree, plan.unpacked_files_fd,
                                                config.verbose);
        }
        if (plan.unpacked_files_fd >= 0) (void)::close(plan.unpacked_files_fd);
        // Last fork done: from here on this process may have a second thread.
        LookAhead look_ahead =
            image.kind == ImageSource::Kind::kSquashfs
                ? start_look_ahead(warm_up_root, first_lookups(config, kDefaultPayloadPath),
                                   context.warm_up_names != nullptr ? *context.warm_up_names
                                                                    : std::vector<WarmUpName>{})
                : LookAhead();
        if (::send(image_ready.get(), "1", 1, MSG_NOSIGNAL) != 1 && errno != EPIPE) {
            throw system_error("cannot tell init that the image is ready");
        }
        image_ready.reset();

        std::optional<Clock::time_point> deadline;
        if (config.timeout_seconds) {
            deadline = started + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(*config.timeout_seconds));
        }
        bool timed_out = false;
        bool server_died = false;
        while (init.running()) {
            std::optional<long> wait_ms;
            if (deadline && !timed_out) {
                wait_ms =
                    std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
            }
            std::optional<siginfo_t> info = wait_for_signal(wait_ms);
            if (!info) {
                timed_out = true;
                init.send(SIGKILL);  // the kernel then kills every process of the pid namespace
                continue;
            }
            if (is_forwarded_signal(info->si_signo)) {
                init.send(info->si_signo);
                continue;
            }
            (void)init.try_reap();
            if (server.running() && server.try_reap()) {
                server_died = true;
                init.send(SIGKILL);
            }
        }

        StageReport report;
        const bool reported =
            receive_last_report(init_report.read_end.get(), report) && !report.only_started();
        if (timed_out && !(reported && report.payload_finished)) {
            report.timed_out = 1;
            report.exit_status = kExitTimeout;
            std::string message =
                "timed out after " + format_seconds(*config.timeout_seconds) + " s; sandbox killed";
            print_error(message);
            report.set_error(message);
        } else if (server_died) {
            fail_stage(context.report_fd, kExitSqboxFailure,
                       "the image server died; sandbox killed");
        } else if (!reported) {
            fail_stage(context.report_fd, kExitSqboxFailure, "sandbox init died unexpectedly");
        }
        if (!report.payload_finished) {
            report.wall_ns =
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started)
                    .count();
        }
        // A learning run's record includes what the warm-up looked up (the directories on the way
        // to a listed name, say). Bounded, and not after a timeout: this process does not act on
        // signals meanwhile, and a wedged server would keep the warm-up waiting.
        if (config.learn_warm_up && !timed_out) (void)look_ahead.finish_within(kLearningWarmUpWait);
        server.kill_and_reap();
        send_report(context.report_fd, report);
        ::_exit(0);
    } catch (const Error& e) {
        fail_stage(context.report_fd, kExitSqboxFailure, e.what());
    }
}

}  // namespace sqbox

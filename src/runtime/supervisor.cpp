#include "runtime/supervisor.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "image/squashfs_server.h"
#include "runtime/image_mount_probe.h"
#include "runtime/image_server_confinement.h"
#include "runtime/init.h"
#include "runtime/look_ahead.h"
#include "runtime/payload.h"
#include "runtime/rootfs.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/user_namespace.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

std::string format_seconds(double seconds) {
    char buffer[32];
    (void)std::snprintf(buffer, sizeof buffer, "%g", seconds);
    return buffer;
}

// How long the supervisor waits for an image server whose connection init found aborted: it is
// on its way out (the kernel aborts the connection as it closes the dying server's descriptors).
constexpr auto kLostServerWait = std::chrono::seconds(2);

int wait_for_lost_server(ChildProcess& server) {
    const auto deadline = Clock::now() + kLostServerWait;
    for (;;) {
        if (const std::optional<int> status = server.try_reap()) return *status;
        if (Clock::now() >= deadline) break;
        ::usleep(1000);
    }
    server.kill_and_reap();
    return SIGKILL;  // a wait status: killed by SIGKILL
}

// A sandbox killed at its deadline that has not ended a grace later: a stalled image server may
// hold it (runtime/image_mount_probe.h). Ending the server fails every request it holds; the
// shared server ends its parser when told.
void end_image_server_if_it_holds(ChildProcess& server, int shared_server) {
    if (!server.running() && shared_server < 0) return;  // a directory's sandbox: no server
    (void)end_image_server_if_stalled([&] {
        if (server.running()) {
            server.send(SIGKILL);  // its death is seen below, as a crash's would be
        } else if (shared_server >= 0) {
            try {
                report_stalled_shared_server(shared_server);
            } catch (const Error&) {
                // The server has gone already; its mount's waits have failed with it.
            }
        }
    });
}

}  // namespace

std::string describe_image_server_death(int wait_status) {
    std::string text = "the image server died";
    if (WIFSIGNALED(wait_status)) {
        const int signal = WTERMSIG(wait_status);
        if (signal == SIGSYS) {
            text += " (killed by its seccomp filter: a system call serving never makes)";
        } else {
            text += " of signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
        }
        text += "; the image may be corrupt";
    } else if (WIFEXITED(wait_status)) {
        text += " (exit status " + std::to_string(WEXITSTATUS(wait_status)) + ")";
    }
    return text;
}

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

ChildProcess start_image_server(const ImageSource& image, int fuse_fd, const IdMapping& ids,
                                const std::vector<int>& close_in_server, ServerRecord* record,
                                FileOpens file_opens) {
    const pid_t self = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the image server");
    if (pid == 0) {
        die_with_parent(self);
        for (int fd : close_in_server) {
            if (fd >= 0) (void)::close(fd);
        }
        try {
            confine_image_server({image.file.get(), fuse_fd});
        } catch (const Error& e) {
            print_error(e.what());
            ::_exit(kExitSqboxFailure);
        }
        int status =
            serve_squashfs(image.squashfs.get(), fuse_fd,
                           {ids.inside_uid, ids.inside_gid, kImageDir, record, file_opens});
        ::_exit(status == 0 ? 0 : kExitSqboxFailure);
    }
    return ChildProcess(pid);
}

ChildProcess mount_image_and_serve(const ImageSource& image, const IdMapping& ids,
                                   const std::vector<int>& close_in_server, UniqueFd* keep_fuse,
                                   ServerRecord* record, FileOpens file_opens) {
    UniqueFd fuse;
    if (image.kind == ImageSource::Kind::kSquashfs) {
        fuse.reset(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
        if (!fuse) throw system_error("cannot open /dev/fuse");
    }
    enter_scratch_root();
    mount_image(image, fuse.get(), ids);
    if (image.kind != ImageSource::Kind::kSquashfs) return {};
    ChildProcess server =
        start_image_server(image, fuse.get(), ids, close_in_server, record, file_opens);
    // Unless kept, `fuse` closes here: the server holds the connection now, and it ends with it.
    if (keep_fuse != nullptr) *keep_fuse = std::move(fuse);
    return server;
}

void leave_process_group() {
    if (::setpgid(0, 0) != 0) throw system_error("setpgid");
}

std::vector<int> descriptors_of(const SupervisorContext& context) {
    return {context.image->file.get(), context.report.get(), context.init_channel.get(),
            context.image_handoff.get(), diagnostics_fd()};
}

InitChannels make_init_channels() {
    InitChannels channels{make_pipe("init report"), make_pipe("lifeline"), {}, {}};
    // A socket rather than a pipe: if init is already gone, the send fails instead of killing
    // this process with SIGPIPE, and init's own report says what happened.
    std::tie(channels.image_ready, channels.init_image_ready) =
        make_message_channel("the image-ready channel");
    return channels;
}

InitContext InitChannels::take_init_ends(const SandboxPlan& plan, UniqueFd channel) {
    image_ready.reset();
    InitContext context = take_init_context(plan, report, lifeline, std::move(channel));
    context.image_ready = std::move(init_image_ready);
    return context;
}

void InitChannels::close_init_ends() {
    report.write_end.reset();
    lifeline.read_end.reset();
    init_image_ready.reset();
}

std::vector<int> server_closes(const SupervisorContext& context, const InitChannels& channels) {
    return {context.report.get(), context.init_channel.get(), channels.report.read_end.get(),
            channels.lifeline.write_end.get(), channels.image_ready.get()};
}

void start_look_ahead_of(const ImageSource& image, const SandboxConfig& config) {
    if (image.kind != ImageSource::Kind::kSquashfs) return;
    start_look_ahead(kImageDir, first_lookups(config, kDefaultPayloadPath));
}

void tell_init_image_ready(UniqueFd& image_ready) {
    if (::send(image_ready.get(), "1", 1, MSG_NOSIGNAL) != 1 && errno != EPIPE) {
        throw system_error("cannot tell init that the image is ready");
    }
    image_ready.reset();
}

SandboxEnd watch_sandbox(ChildProcess& init, ChildProcess& server, Clock::time_point started,
                         std::optional<double> timeout_seconds, int shared_server) {
    std::optional<Clock::time_point> deadline;
    if (timeout_seconds) {
        deadline = started + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(*timeout_seconds));
    }
    SandboxEnd end;
    end.shared_server = shared_server;
    while (init.running()) {
        std::optional<long> wait_ms;
        if (deadline) {
            wait_ms =
                std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
        }
        std::optional<siginfo_t> info = wait_for_signal(wait_ms, shared_server >= 0 ? SIGIO : 0);
        if (!info) {
            if (end.timed_out) end_image_server_if_it_holds(server, shared_server);
            end.timed_out = true;
            init.send(SIGKILL);  // the kernel then kills every process of the pid namespace
            deadline = Clock::now() + kKilledSandboxGrace;
            continue;
        }
        if (is_forwarded_signal(info->si_signo)) {
            init.send(info->si_signo);
            continue;
        }
        (void)init.try_reap();
        if (server.running()) {
            if (const std::optional<int> status = server.try_reap()) {
                end.server_died = true;
                end.server_wait_status = *status;
                init.send(SIGKILL);
            }
        }
        if (shared_server >= 0 && !end.server_died) {
            if (const std::optional<int> status = shared_server_death(shared_server, 0)) {
                end.server_died = true;
                end.server_wait_status = *status;
                init.send(SIGKILL);
            }
        }
    }
    if (server.running()) end.server = &server;
    return end;
}

StageReport final_report(int init_report_fd, const SandboxEnd& end, Clock::time_point started,
                         const SandboxConfig& config, int report_fd) {
    StageReport report;
    const bool reported = receive_last_report(init_report_fd, report) && !report.only_started();
    std::optional<int> server_status;
    if (end.server_died) server_status = end.server_wait_status;
    if (!server_status && end.shared_server >= 0) {
        // A payload that exited 0 came through whatever the server did: only a word already sent
        // counts then, and the mount is not asked (a round trip to the server on every run).
        const bool clean_exit = reported && report.payload_finished != 0 &&
                                report.exit_status == 0 && report.image_server_lost == 0;
        server_status = clean_exit ? shared_server_death(end.shared_server, 0)
                                   : shared_server_death_at_end(end.shared_server);
    }
    if (!server_status && reported && report.image_server_lost != 0 && end.server != nullptr) {
        // Init found the image's connection gone: the server has died or is dying.
        server_status = wait_for_lost_server(*end.server);
    }
    if (end.timed_out && !(reported && report.payload_finished)) {
        report.timed_out = 1;
        report.exit_status = kExitTimeout;
        std::string message =
            "timed out after " + format_seconds(*config.timeout_seconds) + " s; sandbox killed";
        print_error(message);
        report.set_error(message);
    } else if (server_status) {
        fail_stage(report_fd, kExitSqboxFailure,
                   describe_image_server_death(*server_status) + "; sandbox killed");
    } else if (!reported) {
        fail_stage(report_fd, kExitSqboxFailure, "sandbox init died unexpectedly");
    }
    if (!report.payload_finished) {
        report.wall_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count();
    }
    return report;
}

void save_container_changes(const SandboxConfig& config, StageReport& report) {
    try {
        const ReplaySummary saved = save_changes_to_container(config);
        if (config.verbose) {
            print_error("saved " + std::to_string(saved.entries) + " change(s), " +
                        std::to_string(saved.data_bytes) + " bytes, to the container");
        }
        if (saved.setid_dropped != 0) {
            print_error("--rw: " + std::to_string(saved.setid_dropped) +
                        " file(s) written without their setuid/setgid bits");
        }
    } catch (const Error& e) {
        const std::string message =
            std::string("the container's changes were not all saved: ") + e.what();
        print_error(message);
        report.exit_status = kExitSqboxFailure;
        report.set_error(message);
    }
}

}  // namespace sqbox

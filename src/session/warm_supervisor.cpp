#include "session/warm_supervisor.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "runtime/fuse_flushes.h"
#include "runtime/image_mount_probe.h"
#include "runtime/init.h"
#include "runtime/rootfs.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/supervisor.h"
#include "runtime/user_namespace.h"
#include "session/config_codec.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How many image servers may die in one sqbox serve before it gives up.
constexpr int kMaxImageServerRestarts = 16;

struct RunningSandbox {
    ChildProcess init;
    UniqueFd report;    // init's StageReport
    UniqueFd lifeline;  // init dies when this closes
    UniqueFd channel;   // init's: its mount namespace comes this way; a pooled one's request goes
    bool awaits_request = false;         // pooled, and no request handed to it yet
    bool awaits_mount_namespace = true;  // nothing read on `channel` yet
    UniqueFd mount_namespace;  // init's (hand_mount_namespace_to_supervisor), once received
    std::optional<Clock::time_point> deadline;
    bool timed_out = false;
    Clock::time_point started;
};

// How long the first close of a file of the image may take (stop_flushes_before_any_sandbox).
constexpr std::chrono::seconds kFlushStopTimeout{10};

// The request a dead server had read and not answered: the kernel would wait for its answer for
// good (a FLUSH, deaf to SIGKILL, among them), so it is failed with EIO here.
void answer_lost_request(int fuse_fd, ServerRecord* record) {
    if (record == nullptr || record->request_unique == 0) return;
    struct {
        uint32_t length;
        int32_t error;
        uint64_t unique;
    } reply{16, -EIO, record->request_unique};
    record->request_unique = 0;
    // ENOENT: it had been answered (or the id was not a request's).
    (void)!::write(fuse_fd, &reply, sizeof reply);
}

// The image server opens files with no message (FileOpens::kWithoutMessages), which spares each
// sandbox's payload a round trip per file it opens (Python's start opens about 30), and so the
// first FLUSH must be refused before anything holds a file of the mount (runtime/fuse_flushes.h).
// This process keeps the connection's /dev/fuse (`fuse`) to restart servers, so a close waiting on
// a server that died would wait for good: a child makes it, and should the server die or hang
// meanwhile, this process ends the child's wait (below) and closes `fuse`. Throws Error then, or
// when the image has no regular file near its root.
void stop_flushes_before_any_sandbox(ChildProcess& server, UniqueFd& fuse, ServerRecord* record) {
    Pipe failure = make_pipe("the first close's report");
    const pid_t self = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the first close of a file of the image");
    if (pid == 0) {
        die_with_parent(self);
        failure.read_end.reset();
        try {
            close_fds_except({failure.write_end.get()});  // no /dev/fuse, no server channel
            stop_fuse_flushes(kImageDir);
        } catch (const Error& e) {
            (void)!::write(failure.write_end.get(), e.what(), std::strlen(e.what()));
            ::_exit(1);
        }
        ::_exit(0);
    }
    ChildProcess child(pid);
    failure.write_end.reset();
    const UniqueFd child_exit = open_pidfd(child.pid());
    const UniqueFd server_exit = open_pidfd(server.pid());
    if (!child_exit || !server_exit) throw system_error("pidfd_open");
    const auto deadline = Clock::now() + kFlushStopTimeout;
    for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd fds[2] = {{child_exit.get(), POLLIN, 0}, {server_exit.get(), POLLIN, 0}};
        const int ready = ::poll(fds, 2, static_cast<int>(std::max<long long>(0, left.count())));
        if (ready < 0 && errno != EINTR) throw system_error("poll");
        if (fds[0].revents != 0) break;
        if (fds[1].revents == 0 && left.count() > 0) continue;
        // The server is gone, or stuck. A fatal signal ends the child's every wait but a FLUSH's;
        // that one ends when the request the server took fails (EIO), or, not yet taken, when the
        // connection goes with this process's /dev/fuse (sqbox serve does not start).
        child.send(SIGKILL);
        server.send(SIGKILL);
        const int status = server.wait();
        answer_lost_request(fuse.get(), record);
        fuse.reset();
        (void)child.wait();
        throw Error(fds[1].revents != 0 ? describe_image_server_death(status)
                                        : "the image server did not answer within " +
                                              std::to_string(kFlushStopTimeout.count()) + " s");
    }
    const int status = child.wait();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    const std::string why = read_all(failure.read_end.get(), "the first close's report");
    throw Error("image: " + (why.empty() ? std::string("cannot close a file of it") : why));
}

json report_to_json(uint64_t key, const StageReport& report) {
    return {{"key", key},
            {"exit_status", report.exit_status},
            {"payload_started", report.payload_started != 0},
            {"payload_finished", report.payload_finished != 0},
            {"timed_out", report.timed_out != 0},
            {"wait_status", report.wait_status},
            {"wall_ns", report.wall_ns},
            {"cpu_ns", report.cpu_ns},
            {"max_rss_kib", report.max_rss_kib},
            {"error", report.error_message()}};
}

// Drops the last references to ended sandboxes' mount namespaces, and with them their unmounts
// (their waits for RCU grace periods, and freeing a writable layer a payload may have filled), so
// that neither a sandbox's report nor the supervisor's loop, which serves every other sandbox,
// waits for them. A process of its own, forked before any sandbox and holding nothing but its
// socket: a thread would not do, as sandboxes are started with a raw clone, whose child would
// inherit any lock of libc such a thread held at that moment.
class MountNamespaceReleaser {
  public:
    void start() {
        auto [ours, theirs] = make_message_channel("the mount namespaces' releaser");
        const pid_t self = ::getpid();
        const pid_t pid = ::fork();
        if (pid < 0) throw system_error("cannot start the mount namespaces' releaser");
        if (pid == 0) {
            die_with_parent(self);
            ours.reset();
            close_fds_except({theirs.get()});
            // Each message's descriptor closes as the message goes.
            while (receive_fd_message(theirs.get())) {
            }
            ::_exit(0);
        }
        process_ = ChildProcess(pid);
        channel_ = std::move(ours);
    }

    // Hands `mount_namespace` over; where the releaser is gone, it is released here.
    void release(UniqueFd mount_namespace) {
        if (!mount_namespace || !channel_) return;
        try {
            send_fd_message(channel_.get(), MessageTag::kMountNamespace, "",
                            {mount_namespace.get()}, "cannot hand a mount namespace over");
        } catch (const Error&) {
            channel_.reset();
        }
    }

  private:
    ChildProcess process_;
    UniqueFd channel_;
};

class WarmSupervisor {
  public:
    WarmSupervisor(const WarmSupervisorContext& context, const IdMapping& ids)
        : context_(context), ids_(ids) {}

    [[noreturn]] void serve(ChildProcess server, UniqueFd fuse, ServerRecord* record) {
        fuse_server_ = std::move(server);
        fuse_ = std::move(fuse);
        record_ = record;
        releaser_.start();
        sigset_t signals = pipeline_signals();
        UniqueFd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
        if (!signal_fd) throw system_error("signalfd");
        std::vector<pollfd> fds;
        for (;;) {
            fds.assign({{context_.control_fd, POLLIN, 0},
                        {signal_fd.get(), POLLIN, 0},
                        {probe_.running() ? probe_.exit_fd() : -1, POLLIN, 0}});
            for (const auto& [key, sandbox] : sandboxes_) {
                if (sandbox.awaits_mount_namespace) {
                    fds.push_back({sandbox.channel.get(), POLLIN, 0});
                }
            }
            if (::poll(fds.data(), fds.size(), next_timeout_ms()) < 0 && errno != EINTR) {
                throw system_error("poll");
            }
            take_mount_namespaces(fds);
            if (fds[1].revents != 0) {
                signalfd_siginfo info{};
                while (::read(signal_fd.get(), &info, sizeof info) == sizeof info) {
                    // SIGTERM and friends: the server is going away; so do we, with everything.
                    if (is_forwarded_signal(static_cast<int>(info.ssi_signo))) ::_exit(0);
                }
            }
            reap();
            enforce_deadlines();
            judge_probe();
            if (fds[0].revents != 0) {
                std::optional<FdMessage> message = receive_fd_message(context_.control_fd);
                if (!message) ::_exit(0);  // the server is gone: every init dies with us
                handle(*message);
            }
        }
    }

  private:
    // What inits sent on their channels: their mount namespaces, one message each. Anything
    // else (init gone before it sent it) leaves the namespace to init's exit, as without it.
    void take_mount_namespaces(const std::vector<pollfd>& fds) {
        for (auto& [key, sandbox] : sandboxes_) {
            if (!sandbox.awaits_mount_namespace) continue;
            const int channel = sandbox.channel.get();
            const auto polled =
                std::find_if(fds.begin(), fds.end(),
                             [channel](const pollfd& entry) { return entry.fd == channel; });
            if (polled == fds.end() || polled->revents == 0) continue;
            sandbox.awaits_mount_namespace = false;
            std::optional<FdMessage> message = receive_fd_message(sandbox.channel.get());
            if (message && message->tag == MessageTag::kMountNamespace &&
                message->fds.size() == 1 &&
                ::ioctl(message->fds[0].get(), NS_GET_NSTYPE) == CLONE_NEWNS) {
                sandbox.mount_namespace = std::move(message->fds[0]);
            }
            if (!sandbox.awaits_request) sandbox.channel.reset();
        }
    }

    int next_timeout_ms() const {
        std::optional<Clock::time_point> nearest;
        for (const auto& [key, sandbox] : sandboxes_) {
            if (sandbox.deadline && (!nearest || *sandbox.deadline < *nearest)) {
                nearest = sandbox.deadline;
            }
        }
        if (probe_.running() && !probe_judged_ && (!nearest || probe_verdict_at_ < *nearest)) {
            nearest = probe_verdict_at_;
        }
        if (!nearest) return -1;
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*nearest - Clock::now()).count();
        return static_cast<int>(std::max<long long>(0, ms));
    }

    // A sandbox past its deadline is killed; one still there a grace later may be held by a
    // stalled image server (runtime/image_mount_probe.h), which a probe then looks for.
    void enforce_deadlines() {
        const auto now = Clock::now();
        bool killed_and_still_there = false;
        for (auto& [key, sandbox] : sandboxes_) {
            if (!sandbox.deadline || now < *sandbox.deadline) continue;
            killed_and_still_there = killed_and_still_there || sandbox.timed_out;
            sandbox.timed_out = true;
            sandbox.init.send(SIGKILL);  // the whole pid namespace goes with it
            sandbox.deadline = now + kKilledSandboxGrace;
        }
        if (killed_and_still_there && !probe_.running() && probe_.start()) {
            probe_judged_ = false;
            probe_verdict_at_ = now + kStalledServerVerdict;
        }
    }

    // A probe unanswered for its whole verdict time while a killed sandbox is still there: the
    // server has stalled. It is ended and replaced (reap()), and the request it held fails with
    // EIO; so does the probe's, if it held that one, and the probe is reaped once it has.
    void judge_probe() {
        if (!probe_.running() || probe_.answered() || probe_judged_) return;
        if (Clock::now() < probe_verdict_at_) return;
        probe_judged_ = true;
        probe_.stop();
        const bool killed_sandbox_left =
            std::any_of(sandboxes_.begin(), sandboxes_.end(),
                        [](const auto& entry) { return entry.second.timed_out; });
        if (killed_sandbox_left && fuse_server_.running()) fuse_server_.send(SIGKILL);
    }

    void reap() {
        if (fuse_server_.running()) {
            if (const std::optional<int> status = fuse_server_.try_reap()) {
                restart_image_server(*status);
            }
        }
        for (auto it = sandboxes_.begin(); it != sandboxes_.end();) {
            if (!it->second.init.try_reap()) {
                ++it;
                continue;
            }
            finish(it->first, it->second);
            it = sandboxes_.erase(it);
        }
    }

    // The connection lives on in `fuse_`: the request the dead server was answering fails with
    // EIO, and a new server answers the rest, so the sandboxes and sessions of the server go on.
    // An image that keeps killing its servers stops everything, as without restarts.
    void restart_image_server(int wait_status) {
        const std::string death = describe_image_server_death(wait_status);
        if (++restarts_ > kMaxImageServerRestarts || !fuse_) {
            print_error(death + "; stopping every sandbox");
            ::_exit(kExitSqboxFailure);
        }
        answer_lost_request(fuse_.get(), record_);
        fuse_server_ = start_image_server(*context_.image, fuse_.get(), ids_, {context_.control_fd},
                                          record_, FileOpens::kWithoutMessages);
        print_error(death + "; started another (the request it was answering failed with EIO)");
    }

    void finish(uint64_t key, RunningSandbox& sandbox) {
        StageReport report;
        const bool received = receive_last_report(sandbox.report.get(), report);
        const bool reported = received && !report.only_started();
        if (sandbox.timed_out && !(reported && report.payload_finished)) {
            const uint8_t started = received ? report.payload_started : 0;
            report = StageReport{};
            report.payload_started = started;
            report.timed_out = 1;
            report.exit_status = kExitTimeout;
            report.set_error("timed out; sandbox killed");
        } else if (!reported) {
            report = StageReport{};
            report.exit_status = kExitSqboxFailure;
            report.set_error("sandbox init died unexpectedly");
        }
        if (!report.payload_finished) {
            report.wall_ns =
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - sandbox.started)
                    .count();
        }
        send_fd_message(context_.control_fd, MessageTag::kReport,
                        report_to_json(key, report).dump(), {}, "cannot report to the server");
        // Only now, the report sent, its unmounts, elsewhere.
        releaser_.release(std::move(sandbox.mount_namespace));
    }

    void handle(FdMessage& message) {
        json body = json::parse(message.text);
        const auto key = body.at("key").get<uint64_t>();
        if (message.tag == MessageTag::kSignal) {
            auto it = sandboxes_.find(key);
            if (it != sandboxes_.end()) it->second.init.send(body.at("signal").get<int>());
            return;
        }
        if (message.tag == MessageTag::kGo) {
            go(key, body, message.fds);
            return;
        }
        if (message.tag == MessageTag::kDeadline) {
            start_clock(key, body.at("timeout").get<double>());
            return;
        }
        if (message.tag != MessageTag::kStart) throw Error("unexpected message from the server");
        try {
            start(key, message.fds);
        } catch (const Error& e) {
            StageReport report;
            report.exit_status = kExitSqboxFailure;
            report.set_error(e.what());
            send_fd_message(context_.control_fd, MessageTag::kReport,
                            report_to_json(key, report).dump(), {}, "cannot report to the server");
        }
    }

    // A pooled sandbox's request: handed to its init, whose clock starts now.
    void go(uint64_t key, const json& body, const std::vector<UniqueFd>& fds) {
        auto it = sandboxes_.find(key);
        if (it == sandboxes_.end() || !it->second.awaits_request) return;
        RunningSandbox& sandbox = it->second;
        std::vector<int> stdio;
        stdio.reserve(fds.size());
        for (const auto& fd : fds) stdio.push_back(fd.get());
        try {
            send_fd_message(sandbox.channel.get(), MessageTag::kGo, body.dump(), stdio,
                            "cannot hand the request to the sandbox");
        } catch (const Error&) {
            // init is gone; its report follows
        }
        sandbox.awaits_request = false;
        if (!sandbox.awaits_mount_namespace) sandbox.channel.reset();
        sandbox.started = Clock::now();
        if (!body.at("timeout").is_null()) {
            sandbox.deadline = sandbox.started +
                               std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(body.at("timeout").get<double>()));
        }
    }

    // A pre-started sandbox (jobs_prestart.cpp) got its request: its timeout counts from now.
    void start_clock(uint64_t key, double timeout_seconds) {
        auto it = sandboxes_.find(key);
        if (it == sandboxes_.end()) return;
        it->second.started = Clock::now();
        it->second.deadline =
            it->second.started + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_seconds));
    }

    void start(uint64_t key, std::vector<UniqueFd>& fds) {
        if (fds.empty()) throw Error("a sandbox needs its request");
        const json request = json::parse(read_all(fds[0].get(), "the request"));
        fds[0].reset();
        const bool pooled = request.value("pooled", false);
        const size_t first_cgroup_fd = pooled ? 1 : 4;
        if (fds.size() < first_cgroup_fd) throw Error("a sandbox needs stdin, stdout and stderr");
        SandboxConfig config = config_from_json(request.at("config"));
        SandboxPlan plan = context_.plan_template;
        plan.config = &config;
        plan.rlimits = limits_from_json(request.at("rlimits"));
        plan.pooled = pooled;
        plan.own_user_namespace = std::make_pair(ids_.inside_uid, ids_.inside_gid);
        if (config.zygote) {
            if (!context_.zygote_seccomp) throw Error("this server keeps no zygote");
            make_zygote_plan(plan, *context_.zygote_seccomp);
        }

        auto [channel, init_channel] = make_message_channel("the sandbox's channel");
        Pipe report = make_pipe("init report");
        Pipe lifeline = make_pipe("lifeline");

        RunningSandbox sandbox;
        sandbox.started = Clock::now();
        pid_t pid = clone_into_user_namespace(kSandboxNamespaces, "sandbox namespaces");
        if (pid == 0) {
            channel.reset();
            InitContext init = take_init_context(plan, report, lifeline, std::move(init_channel));
            if (!pooled) {
                for (size_t i = 0; i < 3; ++i) init.stdio.at(i) = std::move(fds[i + 1]);
            }
            run_init(std::move(init));
        }
        sandbox.init = ChildProcess(pid);
        sandbox.report = std::move(report.read_end);
        sandbox.lifeline = std::move(lifeline.write_end);
        if (config.timeout_seconds && !pooled) {
            sandbox.deadline =
                sandbox.started + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(*config.timeout_seconds));
        }
        std::vector<int> join_fds;
        for (size_t i = first_cgroup_fd; i < fds.size(); ++i) join_fds.push_back(fds[i].get());
        try {
            send_fd_message(channel.get(), MessageTag::kCgroup, "", join_fds,
                            "cannot hand the cgroup over");
        } catch (const Error&) {
            // init is already gone; its report says why
        }
        sandbox.channel = std::move(channel);
        sandbox.awaits_request = pooled;
        sandboxes_.emplace(key, std::move(sandbox));
    }

    WarmSupervisorContext context_;
    IdMapping ids_;
    ChildProcess fuse_server_;
    ImageMountProbe probe_;  // of a server that may hold a killed sandbox
    bool probe_judged_ = false;
    Clock::time_point probe_verdict_at_{};
    UniqueFd fuse_;  // the image's FUSE connection, for the servers started after the first
    ServerRecord* record_ = nullptr;
    int restarts_ = 0;
    std::map<uint64_t, RunningSandbox> sandboxes_;
    MountNamespaceReleaser releaser_;
};

}  // namespace

void run_warm_supervisor(const WarmSupervisorContext& context) {
    const SandboxConfig& base = *context.base;
    try {
        die_with_parent(context.server_pid);
        if (::setpgid(0, 0) != 0) throw system_error("setpgid");
        // The server's stdin and stdout are its clients' channel: not ours.
        UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
        if (!null || ::dup2(null.get(), STDIN_FILENO) < 0 ||
            ::dup2(null.get(), STDOUT_FILENO) < 0) {
            throw system_error("cannot open /dev/null");
        }
        null.reset();
        close_fds_except({context.image->file.get(), context.control_fd});
        const IdMapping ids = map_ids_and_seal(base);
        // Shared with every image server (see ServerRecord); never unmapped: it lives as long as
        // this process.
        void* shared = ::mmap(nullptr, sizeof(ServerRecord), PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (shared == MAP_FAILED) throw system_error("cannot map the image server's record");
        auto* record = new (shared) ServerRecord;
        UniqueFd fuse;
        ChildProcess server = mount_image_and_serve(*context.image, ids, {context.control_fd},
                                                    &fuse, record, FileOpens::kWithoutMessages);
        if (server.running()) stop_flushes_before_any_sandbox(server, fuse, record);
        if (::mkdir("/session", 0755) != 0) throw system_error("cannot create /session");
        write_file_at(AT_FDCWD, kDriverPathInScratch, context.driver_source, O_EXCL | O_NOFOLLOW,
                      0644);
        send_fd_message(context.control_fd, MessageTag::kReady, "", {},
                        "cannot tell the server we are ready");
        WarmSupervisor(context, ids).serve(std::move(server), std::move(fuse), record);
    } catch (const Error& e) {
        try {
            send_fd_message(context.control_fd, MessageTag::kFailed,
                            json{{"error", e.what()}}.dump(), {}, "cannot report to the server");
        } catch (const Error&) {
        }
        ::_exit(kExitSqboxFailure);
    }
}

}  // namespace sqbox

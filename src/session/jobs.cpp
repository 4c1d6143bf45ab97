#include "session/jobs.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <thread>
#include <utility>

#include "session/config_codec.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr size_t kReadChunk = size_t{256} * 1024;

}  // namespace

StdioPipes make_stdio_pipes() {
    StdioPipes pipes{make_pipe("sandbox stdin"), make_pipe("sandbox stdout"),
                     make_pipe("sandbox stderr")};
    set_nonblocking(pipes.in.write_end.get(), "a descriptor");
    set_nonblocking(pipes.out.read_end.get(), "a descriptor");
    set_nonblocking(pipes.err.read_end.get(), "a descriptor");
    return pipes;
}

std::string last_line(const std::string& text) {
    const size_t end = text.find_last_not_of("\r\n");
    if (end == std::string::npos) return "no output";
    const size_t start = text.find_last_of('\n', end);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    return text.substr(from, end + 1 - from);
}

json failure_report(const std::string& error) {
    return {{"exit_status", kExitSqboxFailure},
            {"payload_started", false},
            {"payload_finished", false},
            {"timed_out", false},
            {"wait_status", 0},
            {"wall_ns", 0},
            {"cpu_ns", 0},
            {"max_rss_kib", 0},
            {"error", error}};
}

Jobs::Jobs(const ServeOptions& options, JobEvents& events)
    : options_(options), events_(events), read_buffer_(kReadChunk, '\0') {
    max_parallel_ = options.max_parallel;
    if (max_parallel_ == 0) {
        max_parallel_ = std::max(1U, 2 * std::thread::hardware_concurrency());
    }
}

Job& Jobs::new_job(int client, RequestSettings settings) {
    const uint64_t key = next_key_++;
    Job& job = jobs_[key];
    job.key = key;
    job.client = client;
    job.settings = std::move(settings);
    return job;
}

void Jobs::send_to_supervisor(MessageTag tag, const json& body, const std::vector<int>& fds) {
    send_fd_message(control_fd_, tag, body.dump(), fds, "cannot reach the supervisor");
}

void Jobs::signal_job(const Job& job, int signal) {
    if (job.zygote_run) {
        // Its sandbox is the zygote's child: only killing it is ever asked for (a timeout, a
        // client gone), and the zygote does that.
        if (job.started && !job.report) send_to_zygote(MessageTag::kSignal, job.key, {});
        return;
    }
    if (job.started && !job.report) {
        send_to_supervisor(MessageTag::kSignal, {{"key", job.key}, {"signal", signal}}, {});
    }
}

void Jobs::signal(uint64_t key, int signal) {
    auto it = jobs_.find(key);
    if (it != jobs_.end()) signal_job(it->second, signal);
}

// ---- runs ----

void Jobs::start_run(int client, const json& request, bool python) {
    if (python && (!request.contains("code") || request.contains("command"))) {
        throw Error("run_python takes code (Python source), not a command");
    }
    RequestSettings settings = settings_from_request(request, options_.base, false);
    const bool stream = request.value("stream", false);  // checked before the job exists
    Job& job = new_job(client, std::move(settings));
    job.id = request.value("id", json(nullptr));
    job.python_run = python;
    job.wants_prestarted = python && prestarted_can_serve(request);
    job.poolable =
        !request.contains("mounts") && !request.contains("memory") && !request.contains("pids");
    job.stream = stream;
    const auto limit = job.settings.config.output_limit_bytes;
    job.out.limit = job.err.limit = limit ? *limit : kDefaultRunOutputLimit;
    waiting_runs_.push_back(job.key);
    start_waiting_runs();
}

void Jobs::start_waiting_runs() {
    while (running_runs_ < max_parallel_ && !waiting_runs_.empty()) {
        const uint64_t key = waiting_runs_.front();
        waiting_runs_.pop_front();
        auto it = jobs_.find(key);
        if (it == jobs_.end() || it->second.abandoned) {
            if (it != jobs_.end()) jobs_.erase(it);
            continue;
        }
        ++running_runs_;
        if (zygote_can_take(it->second)) {
            it->second.counted = true;
            if (zygote_ready_) {
                hand_to_zygote(it->second);
            } else {
                waiting_for_zygote_.push_back(key);
            }
            continue;
        }
        if (it->second.wants_prestarted && !prestarted_.empty()) {
            hand_to_prestarted(it->second);
            jobs_.erase(it);
            if (prestarted_.empty()) fill_prestarted(1);
            continue;
        }
        if (it->second.poolable && !pool_ready_.empty()) {
            hand_to_pooled(it->second);
            jobs_.erase(it);
            if (pool_ready_.empty()) fill_pool_to(1);
            continue;
        }
        it->second.counted = true;
        launch(it->second);
    }
    refill_if_idle();
}

void Jobs::abandon_runs_of(int client) {
    for (auto& [key, job] : jobs_) {
        if (job.client == client && job.session.empty()) {
            job.abandoned = true;
            signal_job(job, SIGKILL);
        }
    }
}

bool Jobs::runs_under_way() const {
    return std::any_of(jobs_.begin(), jobs_.end(), [](const auto& entry) {
        const Job& job = entry.second;
        return job.session.empty() && !job.abandoned && !job.in_pool && !job.zygote;
    });
}

// ---- the pool: sandboxes set up ahead with the server's defaults ----

void Jobs::fill_pool() {
    fill_pool_to(options_.pool);
    fill_prestarted();
    fill_zygote();
}

void Jobs::fill_pool_to(size_t target) {
    while (pool_enabled_ && pool_ready_.size() < std::min<size_t>(target, options_.pool)) {
        RequestSettings settings;
        settings.config = options_.base;
        settings.config.command = {"pooled"};  // replaced by the request's
        Job& job = new_job(-1, std::move(settings));
        job.pooled = job.in_pool = true;
        pool_ready_.push_back(job.key);
        launch(job);
    }
}

void Jobs::refill_if_idle() {
    if (!runs_under_way()) fill_pool();
}

// Moves a run request onto a ready pooled sandbox and starts it there.
void Jobs::hand_to_pooled(Job& request) {
    const uint64_t key = pool_ready_.front();
    pool_ready_.pop_front();
    Job& job = jobs_.at(key);
    job.in_pool = false;
    job.counted = true;
    job.client = request.client;
    job.id = request.id;
    job.out.limit = request.out.limit;
    job.err.limit = request.err.limit;
    job.stream = request.stream;
    const SandboxConfig& asked = request.settings.config;
    const std::vector<std::pair<std::string, std::string>> additions(
        asked.environment.begin() + static_cast<std::ptrdiff_t>(options_.base.environment.size()),
        asked.environment.end());
    json go = {
        {"key", key},
        {"command", asked.command},
        {"environment", additions},
        {"workdir", asked.workdir},
        {"cpu_seconds", asked.limits.cpu_seconds ? json(*asked.limits.cpu_seconds) : json(nullptr)},
        {"timeout", asked.timeout_seconds ? json(*asked.timeout_seconds) : json(nullptr)}};
    job.settings = std::move(request.settings);
    try {
        StdioPipes pipes = make_stdio_pipes();
        send_to_supervisor(
            MessageTag::kGo, go,
            {pipes.in.read_end.get(), pipes.out.write_end.get(), pipes.err.write_end.get()});
        take_stdio(job, pipes);
    } catch (const Error& e) {
        signal_job(job, SIGKILL);
        job.report = failure_report(e.what());
        maybe_finish(key);
    }
}

// ---- sandboxes ----

uint64_t Jobs::add_session_job(int client, const std::string& session, RequestSettings settings) {
    Job& job = new_job(client, std::move(settings));
    job.session = session;
    job.keep_stdin_open = true;
    return job.key;
}

void Jobs::launch(uint64_t key) {
    launch(jobs_.at(key));
}

// Hands the sandbox to the supervisor. A failure becomes the job's report.
void Jobs::launch(Job& job) {
    try {
        SandboxConfig& config = job.settings.config;
        job.cgroup = SandboxCgroup::plan(config);
        std::vector<int> join_fds;
        ResourceLimits rlimits = config.limits;
        if (job.cgroup) {
            job.cgroup->create();
            join_fds = job.cgroup->join_fds();
            drop_limits_held_by_cgroup(cgroup_held_limits(*job.cgroup), rlimits);
        }
        if (config.limits.cpus && (!job.cgroup || !job.cgroup->limits_cpu())) {
            throw Error("cpus needs a cgroup with the cpu controller");
        }
        // The configuration can be large (code, environment): it travels in a memfd.
        UniqueFd request(::memfd_create("sqbox-request", MFD_CLOEXEC));
        const std::string text = json{
            {"config", config_to_json(config)},
            {"rlimits", limits_to_json(rlimits)},
            {"pooled", job.pooled}}.dump();
        if (!request || !write_all(request.get(), text.data(), text.size()) ||
            ::lseek(request.get(), 0, SEEK_SET) != 0) {
            throw system_error("cannot pass the request to the supervisor");
        }
        std::vector<int> fds = {request.get()};
        if (job.pooled) {
            fds.insert(fds.end(), join_fds.begin(), join_fds.end());
            send_to_supervisor(MessageTag::kStart, {{"key", job.key}}, fds);
            job.started = true;
            return;
        }
        StdioPipes pipes = make_stdio_pipes();
        // The zygote's stdin is its channel: requests and their descriptors come on it.
        UniqueFd zygote_end;
        if (job.zygote) {
            auto [server_end, zygote_channel] = make_message_channel("the zygote's channel");
            set_nonblocking(server_end.get(), "the zygote's channel");
            zygote_channel_ = std::move(server_end);
            zygote_end = std::move(zygote_channel);
        }
        fds.insert(fds.end(), {job.zygote ? zygote_end.get() : pipes.in.read_end.get(),
                               pipes.out.write_end.get(), pipes.err.write_end.get()});
        fds.insert(fds.end(), join_fds.begin(), join_fds.end());
        send_to_supervisor(MessageTag::kStart, {{"key", job.key}}, fds);
        job.started = true;
        take_stdio(job, pipes);  // the zygote's stdin (a pipe nobody reads) closes at once
    } catch (const Error& e) {
        job.report = failure_report(e.what());
        maybe_finish(job.key);
    }
}

void Jobs::retire(uint64_t key) {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    it->second.abandoned = true;
    it->second.stdin_fd.reset();
    signal_job(it->second, SIGKILL);
    // Its report still arrives and is dropped then; if it already has, drop the job now.
    if (it->second.report || !it->second.started) jobs_.erase(it);
}

// ---- stdio ----

// The server's ends of a sandbox's stdio, once the sandbox has the others; its stdin is fed what
// the request brought, then closed (unless it stays open: a session's).
void Jobs::take_stdio(Job& job, StdioPipes& pipes) {
    job.stdin_fd = std::move(pipes.in.write_end);
    job.out.fd = std::move(pipes.out.read_end);
    job.err.fd = std::move(pipes.err.read_end);
    job.stdin_pending = job.settings.stdin_data;
    write_stdin(job.key);
}

bool Jobs::feed_stdin(uint64_t key, const std::string& bytes) {
    Job& job = jobs_.at(key);
    if (job.stdin_pending.size() > kMaxRequestBytes) return false;
    job.stdin_pending += bytes;
    write_stdin(key);
    return true;
}

void Jobs::write_stdin(uint64_t key) {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    while (job.stdin_fd && !job.stdin_pending.empty()) {
        const ssize_t n =
            ::write(job.stdin_fd.get(), job.stdin_pending.data(), job.stdin_pending.size());
        if (n > 0) {
            job.stdin_pending.erase(0, static_cast<size_t>(n));
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        job.stdin_fd.reset();  // the payload closed its stdin
        job.stdin_pending.clear();
    }
    if (job.stdin_pending.empty() && !job.keep_stdin_open) job.stdin_fd.reset();
}

void Jobs::read_output(uint64_t key, bool stdout_stream) {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    Capture& capture = stdout_stream ? job.out : job.err;
    std::string& buffer = read_buffer_;
    const ssize_t n = ::read(capture.fd.get(), buffer.data(), buffer.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        capture.fd.reset();
        if (job.stream) stream_output(job, stdout_stream, true);
        if (!job.session.empty() && stdout_stream) events_.session_output_closed(job);
        maybe_finish(key);
        return;
    }
    std::string_view chunk(buffer.data(), static_cast<size_t>(n));
    if (job.prestarted && stdout_stream && !job.readiness.ready()) {
        chunk = job.readiness.take(chunk);
        if (job.readiness.ready()) prestart_failures_ = 0;
    }
    if (!job.session.empty()) {
        if (stdout_stream) {
            events_.session_output(job, chunk);
        } else {
            events_.session_log(job, chunk);
        }
        return;
    }
    const uint64_t room =
        capture.limit > capture.data.size() ? capture.limit - capture.data.size() : 0;
    if (chunk.size() > room) capture.truncated = true;
    capture.data.append(chunk.substr(0, std::min<uint64_t>(room, chunk.size())));
    if (job.stream) stream_output(job, stdout_stream, false);
}

// What a streaming run's stream has kept since its last event goes out as one.
void Jobs::stream_output(Job& job, bool stdout_stream, bool ended) {
    if (job.abandoned) return;
    Capture& capture = stdout_stream ? job.out : job.err;
    const std::string_view fresh = capture.streamed.next(capture.data, job.settings.binary, ended);
    if (fresh.empty()) return;
    events_.run_output(job.client, output_event(job.id, stdout_stream ? "stdout" : "stderr", fresh,
                                                job.settings.binary));
}

void Jobs::watch(const PollWatch& watch) {
    for (auto& [key, job] : jobs_) {
        const uint64_t job_key = key;
        // A client behind with its answers: the output it would get as events waits in the
        // pipe (the payload blocks), not in the server. A session's driver log is still read.
        const bool held = (job.stream || !job.session.empty()) && !job.abandoned &&
                          events_.client_backlogged(job.client);
        if (job.out.fd && !held) {
            watch(job.out.fd.get(), POLLIN, [this, job_key](short) { read_output(job_key, true); });
        }
        if (job.err.fd && !(held && job.session.empty())) {
            watch(job.err.fd.get(), POLLIN,
                  [this, job_key](short) { read_output(job_key, false); });
        }
        if (job.stdin_fd && !job.stdin_pending.empty()) {
            watch(job.stdin_fd.get(), POLLOUT, [this, job_key](short) { write_stdin(job_key); });
        }
    }
    if (zygote_channel_) watch(zygote_channel_.get(), POLLIN, [this](short) { read_zygote(); });
}

// ---- the end of a sandbox ----

void Jobs::take_report(json report) {
    const auto key = report.at("key").get<uint64_t>();
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    it->second.report = std::move(report);
    maybe_finish(key);
}

void Jobs::maybe_finish(uint64_t key) {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (!job.session.empty()) {
        if (!job.report) return;
        events_.session_sandbox_ended(job, job.report->value("error", ""));
        jobs_.erase(it);
        return;
    }
    if (job.zygote) {
        if (job.report) zygote_ended(job);
        return;
    }
    if (job.prestarted && (job.in_pool || !job.readiness.ready())) {
        prestarted_ended(job);
        return;
    }
    if (job.in_pool) {
        if (!job.report) return;
        // Set up ahead and gone before any request: something is wrong with the defaults.
        pool_ready_.erase(std::remove(pool_ready_.begin(), pool_ready_.end(), key),
                          pool_ready_.end());
        if (++pool_failures_ >= 3 && pool_enabled_) {
            pool_enabled_ = false;
            print_error("warning: pooled sandboxes keep failing (" +
                        job.report->value("error", std::string("no report")) +
                        "); the pool is off");
        }
        jobs_.erase(it);
        fill_pool();
        return;
    }
    if (!job.report || job.out.fd || job.err.fd) return;
    if (!job.abandoned) events_.run_finished(job.client, run_answer(job));
    if (job.counted) --running_runs_;
    jobs_.erase(it);
    start_waiting_runs();  // and the pools' refill, if no run is under way
}

json Jobs::run_answer(Job& job) {
    const json& report = *job.report;
    const int wait_status = report.value("wait_status", 0);
    const bool finished =
        report.value("payload_finished", false) && report.value("payload_started", false);
    const bool timed_out = report.value("timed_out", false);
    json signal = nullptr;
    if (timed_out) {
        signal = SIGKILL;
    } else if (finished && WIFSIGNALED(wait_status)) {
        signal = WTERMSIG(wait_status);
    }
    json answer = {{"id", job.id},
                   {"ok", true},
                   {"exit_code", report.value("exit_status", kExitSqboxFailure)},
                   {"signal", signal},
                   {"timed_out", timed_out},
                   {"oom_killed", job.cgroup && job.cgroup->oom_killed()},
                   {"stdout_truncated", job.out.truncated},
                   {"stderr_truncated", job.err.truncated},
                   {"wall_ms", static_cast<double>(report.value("wall_ns", int64_t{0})) / 1e6},
                   {"cpu_ms", static_cast<double>(report.value("cpu_ns", int64_t{0})) / 1e6}};
    if (job.settings.binary) {
        answer["stdout_b64"] = base64_encode(job.out.data);
        answer["stderr_b64"] = base64_encode(job.err.data);
    } else {
        answer["stdout"] = std::move(job.out.data);
        answer["stderr"] = std::move(job.err.data);
    }
    if (job.python_run) answer["prestarted"] = job.prestarted || job.zygote_run;
    if (job.zygote_run) answer["zygote"] = true;
    if (job.prestarted) {
        // From the request's hand-over, without the interpreter's start and imports.
        answer["wall_ms"] = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - job.handed_at)
                                .count();
        const auto cpu_ns =
            static_cast<uint64_t>(std::max<int64_t>(0, report.value("cpu_ns", int64_t{0})));
        answer["cpu_ms"] =
            static_cast<double>(cpu_ns - std::min(cpu_ns, job.readiness.cpu_ns())) / 1e6;
    }
    const std::string error = report.value("error", "");
    if (!error.empty() && answer["exit_code"] == kExitSqboxFailure) {
        answer["error"] = error_object("SandboxError", error);
    }
    return answer;
}

}  // namespace sqbox

// The zygote (--zygote, docs/serve.md): the part of Jobs (jobs.h) that keeps one sandbox whose
// python3 has imported the --preload modules and forks a new sandbox for each run_python request
// (src/session/zygote.py), hands it requests over its channel, and turns what it reports into
// answers. The zygote is the image's interpreter: everything it sends is read as untrusted.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "session/jobs.h"
#include "session/zygote.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

// What is kept of the zygote's own output: enough to say why it failed.
constexpr uint64_t kZygoteLogBytes = uint64_t{64} * 1024;

// "KEY WAIT_STATUS CPU_NS MAX_RSS_KIB" of the zygote's report; nullopt when malformed.
struct ZygoteExit {
    uint64_t key = 0;
    int wait_status = 0;
    int64_t cpu_ns = 0;
    int64_t max_rss_kib = 0;
};

template <typename Number>
bool take_number(std::string_view& text, Number& value) {
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end == text.data()) return false;
    text.remove_prefix(static_cast<size_t>(end - text.data()));
    return true;
}

std::optional<ZygoteExit> parse_exit(std::string_view text) {
    ZygoteExit exit;
    if (!take_number(text, exit.key) || !take_number(text, exit.wait_status) ||
        !take_number(text, exit.cpu_ns) || !take_number(text, exit.max_rss_kib) || !text.empty()) {
        return std::nullopt;
    }
    return exit;
}

int exit_status_of(int wait_status) {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
    return kExitSqboxFailure;
}

}  // namespace

bool Jobs::zygote_can_take(const Job& request) const {
    return options_.zygote && zygote_enabled_ && request.wants_prestarted;
}

void Jobs::fill_zygote() {
    if (!options_.zygote || !zygote_enabled_ || zygote_key_ != 0) return;
    RequestSettings settings;
    settings.config = options_.base;
    settings.config.zygote = true;
    settings.config.command = zygote_command(zygote_settings_, options_.preload);
    Job& job = new_job(-1, std::move(settings));
    job.zygote = true;
    job.out.limit = job.err.limit = kZygoteLogBytes;
    zygote_key_ = job.key;
    zygote_ready_ = false;
    launch(job);
}

void Jobs::send_to_zygote(MessageTag tag, uint64_t key, const std::vector<int>& fds) {
    if (!zygote_channel_) throw Error("the zygote has ended");
    send_fd_message(zygote_channel_.get(), tag, std::to_string(key), fds,
                    "cannot reach the zygote");
}

// Sends a run_python request to the zygote: its code and settings in a memfd, its stdio.
void Jobs::hand_to_zygote(Job& job) {
    job.zygote_run = true;
    job.handed_at = std::chrono::steady_clock::now();
    const auto& timeout = job.settings.config.timeout_seconds;
    if (timeout) {
        job.deadline = job.handed_at + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::duration<double>(*timeout));
    }
    try {
        const std::string frame = python_request_frame(job);
        UniqueFd request(::memfd_create("sqbox-python-request", MFD_CLOEXEC));
        if (!request || !write_all(request.get(), frame.data(), frame.size()) ||
            ::lseek(request.get(), 0, SEEK_SET) != 0) {
            throw system_error("cannot pass the request to the zygote");
        }
        StdioPipes pipes = make_stdio_pipes();
        send_to_zygote(MessageTag::kGo, job.key,
                       {request.get(), pipes.in.read_end.get(), pipes.out.write_end.get(),
                        pipes.err.write_end.get()});
        job.started = true;
        take_stdio(job, pipes);
    } catch (const Error& e) {
        job.report = failure_report(e.what());
        maybe_finish(job.key);
    }
}

// What the zygote says: that it is ready, or that a request's sandbox has ended. A message that
// is not one of those, or names no request it was handed, is dropped. At most
// kZygoteMessagesPerRound a call: a zygote that sends without pause (the image's interpreter runs
// it) must not keep the server from its clients; the poll loop comes back for the rest.
void Jobs::read_zygote() {
    constexpr int kZygoteMessagesPerRound = 64;
    for (int read = 0; zygote_channel_ && read < kZygoteMessagesPerRound; ++read) {
        errno = 0;
        std::optional<FdMessage> message = receive_message_without_fds(zygote_channel_.get());
        if (!message) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            zygote_channel_.reset();  // its report comes from the supervisor
            return;
        }
        if (message->tag == MessageTag::kReady && !zygote_ready_) {
            zygote_ready_ = true;
            zygote_failures_ = 0;
            release_waiting_for_zygote();
            continue;
        }
        if (message->tag != MessageTag::kReport) continue;
        const std::optional<ZygoteExit> exit = parse_exit(message->text);
        if (!exit) continue;
        auto it = jobs_.find(exit->key);
        if (it == jobs_.end() || !it->second.zygote_run || it->second.report) continue;
        Job& job = it->second;
        const auto wall = std::chrono::steady_clock::now() - job.handed_at;
        job.report =
            json{{"exit_status", job.timed_out ? kExitTimeout : exit_status_of(exit->wait_status)},
                 {"payload_started", true},
                 {"payload_finished", true},
                 {"timed_out", job.timed_out},
                 {"wait_status", exit->wait_status},
                 {"wall_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count()},
                 {"cpu_ns", exit->cpu_ns},
                 {"max_rss_kib", exit->max_rss_kib}};
        maybe_finish(exit->key);
    }
}

// The zygote's sandbox has ended (a crash, an import that failed, the server's end). The requests
// it was serving end with an error: their sandboxes were inside its own and went with it. Another
// zygote starts, unless they keep failing before they are ready; then run_python requests get a
// `python3 -c` sandbox of their own.
void Jobs::zygote_ended(Job& zygote) {
    const bool was_ready = zygote_ready_;
    const std::string why = zygote.report->value("error", std::string()).empty()
                                ? last_line(zygote.err.data)
                                : zygote.report->value("error", std::string());
    zygote_key_ = 0;
    zygote_ready_ = false;
    zygote_channel_.reset();
    jobs_.erase(zygote.key);
    std::vector<uint64_t> served;
    for (auto& [key, job] : jobs_) {
        if (job.zygote_run && !job.report) served.push_back(key);
    }
    for (const uint64_t key : served) {
        jobs_.at(key).report = failure_report("the zygote ended while this request ran: " + why);
        maybe_finish(key);
    }
    if (!was_ready && ++zygote_failures_ >= 3 && zygote_enabled_) {
        zygote_enabled_ = false;
        print_error("warning: the zygote keeps failing (" + why + "); --zygote is off");
        release_waiting_for_zygote();
        return;
    }
    fill_zygote();
}

// The run_python requests that waited for the zygote: handed to it now that it is ready, or each
// given a `python3 -c` sandbox of its own now that --zygote is off.
void Jobs::release_waiting_for_zygote() {
    while (!waiting_for_zygote_.empty()) {
        const uint64_t key = waiting_for_zygote_.front();
        waiting_for_zygote_.pop_front();
        auto it = jobs_.find(key);
        if (it == jobs_.end()) continue;
        if (zygote_enabled_) {
            hand_to_zygote(it->second);
        } else {
            launch(it->second);
        }
    }
}

std::optional<std::chrono::steady_clock::time_point> Jobs::next_deadline() const {
    std::optional<std::chrono::steady_clock::time_point> nearest;
    for (const auto& [key, job] : jobs_) {
        if (!job.deadline || job.report || job.timed_out) continue;
        if (!nearest || *job.deadline < *nearest) nearest = job.deadline;
    }
    return nearest;
}

void Jobs::check_deadlines(std::chrono::steady_clock::time_point now) {
    for (auto& [key, job] : jobs_) {
        if (!job.deadline || job.report || job.timed_out || *job.deadline > now) continue;
        job.timed_out = true;
        try {
            signal_job(job, SIGKILL);
        } catch (const Error&) {
            // The zygote is gone: its end fails the request.
        }
    }
}

}  // namespace sqbox

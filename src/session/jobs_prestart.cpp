// The pool of pre-started interpreters (--prestart, docs/serve.md): the part of Jobs (jobs.h) that
// keeps sandboxes whose python3 has imported the --preload modules and waits for code, hands each
// one run_python request, and refills. Every such sandbox serves one request and is never reused.
#include <algorithm>

#include "session/jobs.h"
#include "session/prestart.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// What is kept of a waiting interpreter's stderr: enough to say why its imports failed.
constexpr uint64_t kWarmUpLogBytes = uint64_t{64} * 1024;

}  // namespace

void Jobs::fill_prestarted(size_t target) {
    while (prestart_enabled_ && prestarted_.size() < std::min<size_t>(target, options_.prestart)) {
        RequestSettings settings;
        settings.config = options_.base;
        settings.config.command = prestart_command(options_.preload);
        Job& job = new_job(-1, std::move(settings));
        job.prestarted = job.in_pool = true;
        job.keep_stdin_open = true;  // the request comes on it
        job.err.limit = kWarmUpLogBytes;
        prestarted_.push_back(job.key);
        launch(job);
    }
}

// A run_python request as prestart.py (and zygote.py) read it: its code, working directory,
// environment additions and cpu_time.
std::string Jobs::python_request_frame(const Job& request) const {
    const SandboxConfig& asked = request.settings.config;
    const std::vector<std::pair<std::string, std::string>> additions(
        asked.environment.begin() + static_cast<std::ptrdiff_t>(options_.base.environment.size()),
        asked.environment.end());
    const std::string workdir = asked.workdir == options_.base.workdir ? "" : asked.workdir;
    // The command is python3 -c CODE (settings_from_request), which a retry would run as it is.
    return prestart_request_frame(asked.command.at(2), workdir, additions,
                                  asked.limits.cpu_seconds);
}

// Moves a run_python request onto a pre-started interpreter, one that is ready if any is (one
// still importing takes it once it is ready), and sends it the code.
void Jobs::hand_to_prestarted(Job& request) {
    auto chosen = std::find_if(prestarted_.begin(), prestarted_.end(),
                               [this](uint64_t key) { return jobs_.at(key).readiness.ready(); });
    if (chosen == prestarted_.end()) chosen = prestarted_.begin();
    const uint64_t key = *chosen;
    prestarted_.erase(chosen);
    Job& job = jobs_.at(key);
    job.in_pool = false;
    job.counted = true;
    job.python_run = true;
    job.client = request.client;
    job.id = request.id;
    job.handed_at = std::chrono::steady_clock::now();
    // What the imports wrote is not the request's.
    job.out.data.clear();
    job.err.data.clear();
    job.err.truncated = job.out.truncated = false;
    job.out.limit = request.out.limit;
    job.err.limit = request.err.limit;
    const SandboxConfig& asked = request.settings.config;
    job.stdin_pending = python_request_frame(request) + request.settings.stdin_data;
    job.keep_stdin_open = false;
    if (asked.timeout_seconds) {
        // The sandbox's clock starts now, not when it was set up.
        try {
            send_to_supervisor(MessageTag::kDeadline,
                               {{"key", key}, {"timeout", *asked.timeout_seconds}}, {});
        } catch (const Error&) {
            // The supervisor is gone; the server stops when it sees that, and every sandbox
            // went with it.
        }
    }
    job.settings = std::move(request.settings);
    write_stdin(key);
}

// A pre-started interpreter ended before it was ready, or while it waited in the pool. In the
// pool: the pool refills, and is turned off if they keep failing (a --preload module the image
// lacks). Handed a request: its code never ran (the interpreter reads it only once ready), so the
// request gets a `python3 -c` sandbox of its own instead.
void Jobs::prestarted_ended(Job& job) {
    if (!job.report || job.out.fd || job.err.fd) return;
    const uint64_t key = job.key;
    if (!job.readiness.ready() && ++prestart_failures_ >= 3 && prestart_enabled_) {
        prestart_enabled_ = false;
        std::string why = job.report->value("error", std::string());
        if (why.empty()) why = last_line(job.err.data);
        print_error("warning: pre-started interpreters keep failing (" + why +
                    "); --prestart is off");
    }
    if (job.in_pool) {
        prestarted_.erase(std::remove(prestarted_.begin(), prestarted_.end(), key),
                          prestarted_.end());
        jobs_.erase(key);
        fill_prestarted();
        return;
    }
    if (!job.abandoned) {
        Job& retry = new_job(job.client, std::move(job.settings));
        retry.id = job.id;
        retry.python_run = true;
        retry.out.limit = job.out.limit;
        retry.err.limit = job.err.limit;
        waiting_runs_.push_front(retry.key);
    }
    if (job.counted) --running_runs_;
    jobs_.erase(key);
    fill_prestarted();
    start_waiting_runs();
}

}  // namespace sqbox

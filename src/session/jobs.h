// The sandboxes of `sqbox serve`: each is a job handed to the warm supervisor (warm_supervisor.h)
// with its configuration and stdio. Jobs feed their stdin, capture their output up to a limit,
// and turn the supervisor's report into a run's answer. Run requests beyond --max-parallel wait
// in order; with --pool, sandboxes are set up ahead and serve run requests that keep the
// server's defaults. A session's sandbox is a job too; what comes of it goes to the session.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cgroups.h"
#include "session/output_events.h"
#include "session/prestart.h"
#include "session/protocol_lines.h"
#include "session/request_config.h"
#include "session/server.h"
#include "sqbox/config.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox {

// What a `run` keeps of each output stream when the request sets no output_limit.
// The same as sqbox run's default.
inline constexpr uint64_t kDefaultRunOutputLimit = kDefaultOutputLimit;

// One output stream of a sandbox, kept up to a limit.
struct Capture {
    UniqueFd fd;
    std::string data;
    uint64_t limit = kDefaultRunOutputLimit;
    bool truncated = false;
    StreamedCapture streamed;  // what of `data` went out as output events
};

struct Job {
    uint64_t key = 0;
    int client = -1;
    json id;              // the run request's id
    std::string session;  // set for a session's sandbox
    RequestSettings settings;
    std::optional<SandboxCgroup> cgroup;
    UniqueFd stdin_fd;
    std::string stdin_pending;
    bool keep_stdin_open = false;  // sessions: stdin is the driver's request channel
    bool stream = false;           // a run whose output goes out as events while it runs
    Capture out, err;
    std::optional<json> report;
    bool started = false;
    bool pooled = false;     // set up ahead (--pool); its request comes with 'g'
    bool in_pool = false;    // ...and still waiting for one
    bool poolable = false;   // a run request a pooled sandbox can serve (no mounts, no own limits)
    bool counted = false;    // holds one of the --max-parallel places
    bool abandoned = false;  // nobody wants its result (closed session, gone client)
    // run_python: answered with "prestarted"; `wants_prestarted` when one may serve it.
    bool python_run = false;
    bool wants_prestarted = false;
    // A pre-started interpreter (--prestart): in the pool while in_pool, then serving a request
    // handed to it at `handed_at`.
    bool prestarted = false;
    PrestartReadiness readiness;
    std::chrono::steady_clock::time_point handed_at;
    // --zygote: the zygote's own sandbox, or a request served by a sandbox it made (which the
    // server kills through the zygote at `deadline`).
    bool zygote = false;
    bool zygote_run = false;
    std::optional<std::chrono::steady_clock::time_point> deadline;
    bool timed_out = false;
};

// Shared by the parts of Jobs (jobs.cpp, jobs_prestart.cpp, jobs_zygote.cpp).

// A sandbox's stdin, stdout and stderr, the server's ends non-blocking.
struct StdioPipes {
    Pipe in, out, err;
};
StdioPipes make_stdio_pipes();

// The report of a sandbox that never started, or whose end was not reported: sqbox failed.
json failure_report(const std::string& error);

// The last non-empty line of an interpreter's stderr (a traceback's last is the error).
std::string last_line(const std::string& text);

// Where what comes of the jobs goes.
class JobEvents {
  public:
    // A run's answer, for its client.
    virtual void run_finished(int client, const json& answer) = 0;
    // An output event of a streaming run, for its client.
    virtual void run_output(int client, const json& event) = 0;
    // The client has more answers waiting than kClientBacklogBytes: its streaming sandboxes
    // (and its sessions' drivers) are not read until it catches up.
    virtual bool client_backlogged(int client) const = 0;
    // A session's sandbox: its driver's stdout and stderr, the stdout's end, the sandbox's end.
    virtual void session_output(const Job& job, std::string_view chunk) = 0;
    virtual void session_log(const Job& job, std::string_view chunk) = 0;
    virtual void session_output_closed(const Job& job) = 0;
    virtual void session_sandbox_ended(const Job& job, const std::string& error) = 0;

  protected:
    ~JobEvents() = default;
};

// Registers a descriptor with the poll loop; `handler` gets its revents.
using PollWatch = std::function<void(int fd, short events, std::function<void(short)> handler)>;

class Jobs {
  public:
    Jobs(const ServeOptions& options, JobEvents& events);

    // The supervisor's end of the channel: jobs are sent there. Not owned.
    void connect_supervisor(int control_fd) { control_fd_ = control_fd; }

    // A run request (`python`: a run_python one): started now, or when a --max-parallel place
    // frees up.
    void start_run(int client, const json& request, bool python = false);
    // A session's sandbox: added first (its session learns the key), then launched.
    uint64_t add_session_job(int client, const std::string& session, RequestSettings settings);
    void launch(uint64_t key);
    // Sets up sandboxes (and pre-started interpreters) ahead until the pools are full (or off).
    void fill_pool();
    // The same for the pool alone, up to `target` ready (at most --pool).
    void fill_pool_to(size_t target);

    bool contains(uint64_t key) const { return jobs_.count(key) != 0; }
    // Signals a running sandbox; no-op for one not started or already ended.
    void signal(uint64_t key, int signal);
    // Appends to a job's stdin; false (and nothing appended) when it holds more than a request's
    // worth unread: its reader has stopped reading.
    bool feed_stdin(uint64_t key, const std::string& bytes);
    // A session's sandbox nobody wants any more: killed, its report dropped when it comes.
    void retire(uint64_t key);
    // The client is gone: its runs are killed and their answers dropped.
    void abandon_runs_of(int client);
    // A message of the supervisor's 'r': a sandbox has ended.
    void take_report(json report);

    // A run waiting or running (sessions and the pool do not count).
    bool runs_under_way() const;
    // The descriptors the poll loop watches for the jobs.
    void watch(const PollWatch& watch);
    // At the end, once the supervisor is gone: cgroups are removed now that their processes are.
    void clear() { jobs_.clear(); }

    // --zygote: what the zygote is started with (session/zygote.h).
    void set_zygote_settings(std::string settings) { zygote_settings_ = std::move(settings); }
    // The nearest deadline of a request the zygote serves, and killing those past theirs.
    std::optional<std::chrono::steady_clock::time_point> next_deadline() const;
    void check_deadlines(std::chrono::steady_clock::time_point now);

  private:
    Job& new_job(int client, RequestSettings settings);
    void start_waiting_runs();
    void hand_to_pooled(Job& request);
    void fill_prestarted(size_t target = SIZE_MAX);
    // A take from a pool (or of a pre-started interpreter) is replaced here, once no run is under
    // way, not while it runs: on two vCPUs, setting a sandbox up beside a request took its CPU
    // from the request (bench/README.md, "The pool's refill beside a run"). A take that leaves
    // the pool empty replaces only what it took at once, so that runs under load still find one.
    void refill_if_idle();
    void hand_to_prestarted(Job& request);
    void prestarted_ended(Job& job);
    void fill_zygote();
    bool zygote_can_take(const Job& request) const;
    void hand_to_zygote(Job& request);
    void read_zygote();
    void zygote_ended(Job& job);
    void release_waiting_for_zygote();
    void send_to_zygote(MessageTag tag, uint64_t key, const std::vector<int>& fds);
    std::string python_request_frame(const Job& request) const;
    void launch(Job& job);
    void send_to_supervisor(MessageTag tag, const json& body, const std::vector<int>& fds);
    void signal_job(const Job& job, int signal);
    void take_stdio(Job& job, StdioPipes& pipes);
    void write_stdin(uint64_t key);
    void read_output(uint64_t key, bool stdout_stream);
    void stream_output(Job& job, bool stdout_stream, bool ended);
    void maybe_finish(uint64_t key);
    json run_answer(Job& job);

    const ServeOptions& options_;
    JobEvents& events_;
    int control_fd_ = -1;
    unsigned max_parallel_ = 1;
    std::string read_buffer_;
    std::map<uint64_t, Job> jobs_;
    std::deque<uint64_t> waiting_runs_;
    std::deque<uint64_t> pool_ready_;
    bool pool_enabled_ = true;
    unsigned pool_failures_ = 0;
    std::deque<uint64_t> prestarted_;  // pre-started interpreters not yet handed a request
    bool prestart_enabled_ = true;
    unsigned prestart_failures_ = 0;
    unsigned running_runs_ = 0;
    // --zygote: the zygote's job key (0: none), its end of the channel, whether it said "ready",
    // and run_python requests waiting for it to be.
    std::string zygote_settings_;
    uint64_t zygote_key_ = 0;
    UniqueFd zygote_channel_;
    bool zygote_ready_ = false;
    bool zygote_enabled_ = true;
    unsigned zygote_failures_ = 0;
    std::deque<uint64_t> waiting_for_zygote_;
    uint64_t next_key_ = 1;
};

}  // namespace sqbox

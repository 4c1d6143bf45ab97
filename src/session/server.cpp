#include "session/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "image/image_source.h"
#include "runtime/cgroups.h"
#include "runtime/signals.h"
#include "security/landlock.h"
#include "security/seccomp_choice.h"
#include "session/config_codec.h"
#include "session/request_config.h"
#include "session/session_driver.h"
#include "session/warm_supervisor.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {
namespace {

// Ordered: objects keep their keys' order (a tool's kwargs, a result dict) on their way through.
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr const char* kServerVersion = "sqbox 0.1.0, protocol 1";
// A put of 64 MiB is about 86 MiB of base64; anything longer is not a request.
constexpr size_t kMaxRequestBytes = size_t{96} * 1024 * 1024;
// What a `run` keeps of each output stream when the request sets no output_limit.
constexpr uint64_t kDefaultRunOutputLimit = 16ULL * 1024 * 1024;
constexpr uint64_t kDefaultExecOutputLimit = 1024ULL * 1024;
constexpr size_t kSessionLogBytes = size_t{64} * 1024;
constexpr auto kInterruptGrace = std::chrono::seconds(2);
// Longer timeouts would overflow the clock arithmetic; a week is plenty.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;
constexpr size_t kReadChunk = size_t{256} * 1024;

// Answers can carry 16 MiB of output: built in place, never copied on the way out.
std::string dump_line(const json& message) {
    std::string line = message.dump(-1, ' ', false, json::error_handler_t::replace);
    line += '\n';
    return line;
}

// Deeper JSON is refused while parsing: copying or printing it would recurse off the stack.
constexpr int kMaxJsonDepth = 64;

// Parses one protocol line; throws Error for anything that is not a JSON object of bounded depth.
json parse_message(const std::string& line) {
    json message;
    try {
        message = json::parse(line, [](int depth, json::parse_event_t /*event*/, json& /*value*/) {
            if (depth > kMaxJsonDepth) throw Error("JSON nested too deeply");
            return true;
        });
    } catch (const json::exception& e) {
        throw Error(std::string("not JSON: ") + e.what());
    }
    if (!message.is_object()) throw Error("a message is a JSON object");
    return message;
}

json error_object(const std::string& type, const std::string& message) {
    return {{"type", type}, {"message", message}};
}

struct Pipes {
    Pipe in, out, err;
};

Pipes make_stdio_pipes() {
    Pipes pipes{make_pipe("sandbox stdin"), make_pipe("sandbox stdout"),
                make_pipe("sandbox stderr")};
    set_nonblocking(pipes.in.write_end.get(), "a descriptor");
    set_nonblocking(pipes.out.read_end.get(), "a descriptor");
    set_nonblocking(pipes.err.read_end.get(), "a descriptor");
    return pipes;
}

struct Client {
    int in_fd = -1;
    int out_fd = -1;
    UniqueFd socket;  // socket clients own their descriptor; the stdio client does not
    std::string in;
    size_t scanned = 0;  // bytes of `in` known to hold no newline (long lines arrive in pieces)
    std::string out;
    bool input_closed = false;
    bool broken = false;  // a write failed: nobody reads any more
};

// One output stream of a sandbox, kept up to a limit.
struct Capture {
    UniqueFd fd;
    std::string data;
    uint64_t limit = kDefaultRunOutputLimit;
    bool truncated = false;
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
    Capture out, err;
    std::optional<json> report;
    bool started = false;
    bool pooled = false;     // set up ahead (--pool); its request comes with 'g'
    bool in_pool = false;    // ...and still waiting for one
    bool poolable = false;   // a run request a pooled sandbox can serve (no mounts, no own limits)
    bool counted = false;    // holds one of the --max-parallel places
    bool abandoned = false;  // nobody wants its result (closed session, gone client)
};

struct Session {
    enum class State { kStarting, kIdle, kBusy, kDead };
    std::string id;
    int client = -1;
    uint64_t job = 0;
    State state = State::kStarting;
    RequestSettings settings;  // its sandbox's, from session_open (reset starts the same again)
    std::deque<json> queue;
    json current;  // the request the driver is serving, null when idle
    bool current_internal = false;
    std::optional<Clock::time_point> deadline;
    bool interrupted = false;
    std::vector<std::string> tools;
    bool tool_call_pending = false;                   // the driver waits for the client's answer
    uint64_t output_limit = kDefaultExecOutputLimit;  // each exec's default cap per stream
    std::vector<json> answer_when_ready;              // ids of a session_open and resets
    std::string line;                                 // partial line from the driver
    size_t scanned = 0;                               // bytes of `line` known to hold no newline
    std::string log;                                  // tail of the driver's stderr
    std::string dead_reason;
};

class Server {
  public:
    explicit Server(const ServeOptions& options) : options_(options) {
        max_parallel_ = options.max_parallel;
        if (max_parallel_ == 0) {
            max_parallel_ = std::max(1U, 2 * std::thread::hardware_concurrency());
        }
    }

    int run() {
        watch_parent();
        start_supervisor();
        if (!options_.socket_path.empty()) listen_on_socket();
        Client stdio;
        stdio.in_fd = STDIN_FILENO;
        stdio.out_fd = STDOUT_FILENO;
        set_nonblocking(STDIN_FILENO, "a descriptor");
        set_nonblocking(STDOUT_FILENO, "a descriptor");
        clients_.emplace(next_client_++, std::move(stdio));
        fill_pool();
        loop();
        return exit_status_;
    }

    // Also when run() ends in an error: the sandboxes, their cgroups and the socket file go.
    ~Server() { shut_down(); }

  private:
    // The server lives as long as the process that started it (a Python client, a harness).
    // A pidfd, not PR_SET_PDEATHSIG: that fires when the *thread* that started us exits, and a
    // client may start its server from a worker thread.
    void watch_parent() {
        const pid_t parent = ::getppid();
        parent_.reset(static_cast<int>(::syscall(SYS_pidfd_open, parent, 0)));
        if (!parent_) throw system_error("pidfd_open of the parent process");
        if (::getppid() != parent) stopping_ = true;  // it is already gone
    }

    // ---- the warm supervisor ----

    void start_supervisor() {
        image_ = open_image(options_.base.image);
        if (image_.kind == ImageSource::Kind::kSquashfs &&
            ::access("/dev/fuse", R_OK | W_OK) != 0) {
            throw system_error("cannot use /dev/fuse (needed to mount .sqsh images)");
        }
        WarmSupervisorContext context;
        context.image = &image_;
        context.base = &options_.base;
        context.plan_template = build_sandbox_plan(options_.base);
        context.driver_source = std::string(session_driver_source());
        auto [control, supervisor_end] = make_message_channel("the supervisor's channel");
        control_ = std::move(control);
        context.control_fd = supervisor_end.get();
        context.server_pid = ::getpid();
        pid_t pid = clone_process(CLONE_NEWUSER | CLONE_NEWNS, "the sandbox's user namespace");
        if (pid == 0) {
            control_.reset();
            run_warm_supervisor(context);
        }
        supervisor_ = ChildProcess(pid);
        supervisor_end.reset();
        std::optional<FdMessage> ready = receive_fd_message(control_.get());
        if (!ready) throw Error("the sandbox supervisor died while mounting the image");
        if (ready->tag == MessageTag::kFailed)
            throw Error(json::parse(ready->text).at("error").get<std::string>());
    }

    void send_to_supervisor(MessageTag tag, const json& body, const std::vector<int>& fds) {
        send_fd_message(control_.get(), tag, body.dump(), fds, "cannot reach the supervisor");
    }

    void signal_job(const Job& job, int signal) {
        if (job.started && !job.report) {
            send_to_supervisor(MessageTag::kSignal, {{"key", job.key}, {"signal", signal}}, {});
        }
    }

    // ---- the socket ----

    void listen_on_socket() {
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        if (options_.socket_path.size() >= sizeof address.sun_path) {
            throw Error("--socket " + options_.socket_path + ": path too long");
        }
        std::copy(options_.socket_path.begin(), options_.socket_path.end(), address.sun_path);
        listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!listener_) throw system_error("socket");
        // Created private: nobody else may start sandboxes in our name.
        const mode_t old_mask = ::umask(0177);
        const int bound =
            ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address);
        const int bind_errno = errno;
        ::umask(old_mask);
        if (bound != 0) throw system_error("--socket " + options_.socket_path, bind_errno);
        socket_bound_ = true;
        if (::listen(listener_.get(), 64) != 0) throw system_error("listen");
    }

    void accept_client() {
        UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) return;
        Client client;
        client.in_fd = client.out_fd = fd.get();
        client.socket = std::move(fd);
        clients_.emplace(next_client_++, std::move(client));
    }

    // ---- the loop ----

    void loop() {
        sigset_t signals = pipeline_signals();
        UniqueFd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
        if (!signal_fd) throw system_error("signalfd");
        std::vector<pollfd> fds;
        std::vector<std::function<void(short)>> handlers;
        auto watch = [&](int fd, short events, std::function<void(short)> handler) {
            fds.push_back({fd, events, 0});
            handlers.push_back(std::move(handler));
        };
        while (!stopping_) {
            fds.clear();
            handlers.clear();
            watch(signal_fd.get(), POLLIN, [&](short) { handle_signals(signal_fd.get()); });
            watch(control_.get(), POLLIN, [&](short) { handle_supervisor(); });
            watch(parent_.get(), POLLIN, [&](short) { stopping_ = true; });
            if (listener_) watch(listener_.get(), POLLIN, [&](short) { accept_client(); });
            for (auto& [id, client] : clients_) {
                const int client_id = id;
                if (!client.input_closed) {
                    watch(client.in_fd, POLLIN,
                          [this, client_id](short) { read_client(client_id); });
                }
                if (!client.broken) {
                    // With nothing to write, events 0 still reports POLLERR: the reader is gone.
                    const short events = client.out.empty() ? 0 : POLLOUT;
                    watch(client.out_fd, events, [this, client_id](short revents) {
                        if ((revents & (POLLERR | POLLHUP)) != 0 && (revents & POLLOUT) == 0) {
                            clients_.at(client_id).broken = true;
                        } else {
                            flush_client(client_id);
                        }
                    });
                }
            }
            for (auto& [key, job] : jobs_) {
                const uint64_t job_key = key;
                if (job.out.fd) {
                    watch(job.out.fd.get(), POLLIN,
                          [this, job_key](short) { read_output(job_key, true); });
                }
                if (job.err.fd) {
                    watch(job.err.fd.get(), POLLIN,
                          [this, job_key](short) { read_output(job_key, false); });
                }
                if (job.stdin_fd && !job.stdin_pending.empty()) {
                    watch(job.stdin_fd.get(), POLLOUT,
                          [this, job_key](short) { write_stdin(job_key); });
                }
            }
            if (::poll(fds.data(), fds.size(), next_timeout_ms()) < 0) {
                if (errno == EINTR) continue;
                throw system_error("poll");
            }
            for (size_t i = 0; i < fds.size() && !stopping_; ++i) {
                if (fds[i].revents != 0) handlers[i](fds[i].revents);
            }
            check_deadlines();
            drop_gone_clients();
            if (draining_ && idle()) stopping_ = true;
        }
    }

    // Nothing under way: no run waiting or running, no session starting or busy.
    bool idle() const {
        for (const auto& [key, job] : jobs_) {
            if (job.session.empty() && !job.abandoned && !job.in_pool) return false;
        }
        for (const auto& [id, session] : sessions_) {
            if (session.state == Session::State::kStarting ||
                session.state == Session::State::kBusy || !session.queue.empty()) {
                if (session.state != Session::State::kDead) return false;
            }
        }
        return true;
    }

    void handle_signals(int signal_fd) {
        signalfd_siginfo info{};
        while (::read(signal_fd, &info, sizeof info) == sizeof info) {
            if (is_forwarded_signal(static_cast<int>(info.ssi_signo))) stopping_ = true;
        }
        if (supervisor_.running() && supervisor_.try_reap()) {
            print_error("the sandbox supervisor died; stopping");
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
        }
    }

    int next_timeout_ms() const {
        std::optional<Clock::time_point> nearest;
        for (const auto& [id, session] : sessions_) {
            if (session.deadline && (!nearest || *session.deadline < *nearest)) {
                nearest = session.deadline;
            }
        }
        if (!nearest) return -1;
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*nearest - Clock::now()).count();
        return static_cast<int>(std::max<long long>(0, ms));
    }

    // ---- clients ----

    void read_client(int client_id) {
        Client& client = clients_.at(client_id);
        std::string& buffer = read_buffer_;
        for (;;) {
            ssize_t n = ::read(client.in_fd, buffer.data(), buffer.size());
            if (n > 0) {
                client.in.append(buffer.data(), static_cast<size_t>(n));
                if (static_cast<size_t>(n) < buffer.size()) break;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
            client.input_closed = true;  // EOF or error
            break;
        }
        // Lines are taken by offset and the buffer shifted once: erasing each line from the
        // front would move the rest of the buffer once per line.
        size_t consumed = 0;
        size_t newline;
        while ((newline = client.in.find('\n', std::max(consumed, client.scanned))) !=
               std::string::npos) {
            std::string line = client.in.substr(consumed, newline - consumed);
            consumed = newline + 1;
            if (!line.empty()) handle_line(client_id, line);
            if (clients_.find(client_id) == clients_.end()) return;
        }
        Client& same = clients_.at(client_id);
        same.in.erase(0, consumed);
        same.scanned = same.in.size();
        if (same.in.size() > kMaxRequestBytes) {
            respond(client_id, {{"id", nullptr},
                                {"ok", false},
                                {"error", error_object("BadRequest", "request line too long")}});
            same.in.clear();
            same.input_closed = true;
        }
        if (same.input_closed && same.socket.get() < 0 && options_.socket_path.empty()) {
            // No more requests can come: answer what is under way, then stop.
            draining_ = true;
        }
    }

    void respond(int client_id, const json& message) {
        auto it = clients_.find(client_id);
        if (it == clients_.end() || it->second.broken) return;
        std::string& out = it->second.out;
        if (out.empty()) {
            out = dump_line(message);
        } else {
            out += dump_line(message);
        }
        flush_client(client_id);
    }

    void flush_client(int client_id) {
        Client& client = clients_.at(client_id);
        while (!client.out.empty()) {
            ssize_t n = ::write(client.out_fd, client.out.data(), client.out.size());
            if (n > 0) {
                client.out.erase(0, static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
            client.broken = true;
            client.out.clear();
            return;
        }
    }

    void drop_gone_clients() {
        for (auto it = clients_.begin(); it != clients_.end();) {
            Client& client = it->second;
            const bool stdio = client.socket.get() < 0;
            const bool gone =
                client.broken || (client.input_closed && client.out.empty() && !stdio);
            if (!gone) {
                ++it;
                continue;
            }
            const int client_id = it->first;
            for (auto& [key, job] : jobs_) {
                if (job.client == client_id && job.session.empty()) {
                    job.abandoned = true;
                    signal_job(job, SIGKILL);
                }
            }
            std::vector<std::string> owned;
            for (auto& [id, session] : sessions_) {
                if (session.client == client_id) owned.push_back(id);
            }
            for (const auto& id : owned) destroy_session(id);
            if (stdio && options_.socket_path.empty()) stopping_ = true;
            it = clients_.erase(it);
        }
    }

    // ---- requests ----

    void handle_line(int client_id, const std::string& line) {
        json request;
        try {
            request = parse_message(line);
        } catch (const Error& e) {
            respond(
                client_id,
                {{"id", nullptr}, {"ok", false}, {"error", error_object("BadRequest", e.what())}});
            return;
        }
        // Marks the server's own requests; a client may not send it.
        request.erase("internal");
        json id = request.contains("id") ? request["id"] : json(nullptr);
        try {
            const std::string op = request.value("op", "");
            if (op == "run") {
                start_run(client_id, request);
            } else if (op == "session_open") {
                open_session(client_id, request);
            } else if (op == "exec" || op == "put" || op == "get" || op == "tools") {
                Session& session = owned_session(client_id, request);
                if (session.state == Session::State::kDead) {
                    respond(client_id, dead_answer(session, id));
                    return;
                }
                session.queue.push_back(std::move(request));  // a put's may be tens of MiB
                pump(session);
            } else if (op == "tool_result") {
                forward_tool_result(client_id, request);
            } else if (op == "reset") {
                reset_session(owned_session(client_id, request), id);
            } else if (op == "close") {
                Session& session = owned_session(client_id, request);
                destroy_session(session.id);
                respond(client_id, {{"id", id}, {"ok", true}});
            } else if (op == "ping") {
                respond(client_id, {{"id", id}, {"ok", true}, {"version", kServerVersion}});
            } else if (op == "shutdown") {
                respond(client_id, {{"id", id}, {"ok", true}});
                stopping_ = true;
            } else {
                throw Error("unknown op '" + op + "'");
            }
        } catch (const Error& e) {
            respond(client_id,
                    {{"id", id}, {"ok", false}, {"error", error_object("BadRequest", e.what())}});
        } catch (const json::exception& e) {
            respond(client_id,
                    {{"id", id},
                     {"ok", false},
                     {"error",
                      error_object("BadRequest", std::string("malformed request: ") + e.what())}});
        }
    }

    Session& owned_session(int client_id, const json& request) {
        auto it = sessions_.find(request.at("session").get<std::string>());
        if (it == sessions_.end() || it->second.client != client_id) {
            throw Error("no such session: " + request.at("session").get<std::string>());
        }
        return it->second;
    }

    // ---- sandboxes ----

    Job& new_job(int client_id, RequestSettings settings) {
        const uint64_t key = next_key_++;
        Job& job = jobs_[key];
        job.key = key;
        job.client = client_id;
        job.settings = std::move(settings);
        return job;
    }

    void start_run(int client_id, const json& request) {
        RequestSettings settings = settings_from_request(request, options_.base, false);
        Job& job = new_job(client_id, std::move(settings));
        job.id = request.value("id", json(nullptr));
        job.poolable =
            !request.contains("mounts") && !request.contains("memory") && !request.contains("pids");
        const auto limit = job.settings.config.output_limit_bytes;
        job.out.limit = job.err.limit = limit ? *limit : kDefaultRunOutputLimit;
        waiting_runs_.push_back(job.key);
        start_waiting_runs();
    }

    void start_waiting_runs() {
        while (running_runs_ < max_parallel_ && !waiting_runs_.empty()) {
            const uint64_t key = waiting_runs_.front();
            waiting_runs_.pop_front();
            auto it = jobs_.find(key);
            if (it == jobs_.end() || it->second.abandoned) {
                if (it != jobs_.end()) jobs_.erase(it);
                continue;
            }
            ++running_runs_;
            if (it->second.poolable && !pool_ready_.empty()) {
                hand_to_pooled(it->second);
                jobs_.erase(it);
                fill_pool();
                continue;
            }
            it->second.counted = true;
            launch(it->second);
        }
    }

    // ---- the pool: sandboxes set up ahead with the server's defaults ----

    void fill_pool() {
        while (pool_enabled_ && pool_ready_.size() < options_.pool) {
            RequestSettings settings;
            settings.config = options_.base;
            settings.config.command = {"pooled"};  // replaced by the request's
            Job& job = new_job(-1, std::move(settings));
            job.pooled = job.in_pool = true;
            pool_ready_.push_back(job.key);
            launch(job);
        }
    }

    // Moves a run request onto a ready pooled sandbox and starts it there.
    void hand_to_pooled(Job& request) {
        const uint64_t key = pool_ready_.front();
        pool_ready_.pop_front();
        Job& job = jobs_.at(key);
        job.in_pool = false;
        job.counted = true;
        job.client = request.client;
        job.id = request.id;
        job.out.limit = request.out.limit;
        job.err.limit = request.err.limit;
        const SandboxConfig& asked = request.settings.config;
        const std::vector<std::pair<std::string, std::string>> additions(
            asked.environment.begin() +
                static_cast<std::ptrdiff_t>(options_.base.environment.size()),
            asked.environment.end());
        json go = {
            {"key", key},
            {"command", asked.command},
            {"environment", additions},
            {"workdir", asked.workdir},
            {"cpu_seconds",
             asked.limits.cpu_seconds ? json(*asked.limits.cpu_seconds) : json(nullptr)},
            {"timeout", asked.timeout_seconds ? json(*asked.timeout_seconds) : json(nullptr)}};
        job.settings = std::move(request.settings);
        try {
            Pipes pipes = make_stdio_pipes();
            send_to_supervisor(
                MessageTag::kGo, go,
                {pipes.in.read_end.get(), pipes.out.write_end.get(), pipes.err.write_end.get()});
            job.stdin_fd = std::move(pipes.in.write_end);
            job.out.fd = std::move(pipes.out.read_end);
            job.err.fd = std::move(pipes.err.read_end);
            job.stdin_pending = job.settings.stdin_data;
            if (job.stdin_pending.empty()) {
                job.stdin_fd.reset();
            } else {
                write_stdin(job.key);
            }
        } catch (const Error& e) {
            signal_job(job, SIGKILL);
            job.report = failure_report(e.what());
            maybe_finish(key);
        }
    }

    // Hands the sandbox to the supervisor. A failure becomes the job's report.
    void launch(Job& job) {
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
            Pipes pipes = make_stdio_pipes();
            fds.insert(fds.end(), {pipes.in.read_end.get(), pipes.out.write_end.get(),
                                   pipes.err.write_end.get()});
            fds.insert(fds.end(), join_fds.begin(), join_fds.end());
            send_to_supervisor(MessageTag::kStart, {{"key", job.key}}, fds);
            job.started = true;
            job.stdin_fd = std::move(pipes.in.write_end);
            job.out.fd = std::move(pipes.out.read_end);
            job.err.fd = std::move(pipes.err.read_end);
            job.stdin_pending = job.settings.stdin_data;
            if (job.stdin_pending.empty() && !job.keep_stdin_open) {
                job.stdin_fd.reset();
            } else {
                write_stdin(job.key);
            }
        } catch (const Error& e) {
            job.report = failure_report(e.what());
            maybe_finish(job.key);
        }
    }

    static json failure_report(const std::string& error) {
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

    void write_stdin(uint64_t key) {
        auto it = jobs_.find(key);
        if (it == jobs_.end()) return;
        Job& job = it->second;
        while (job.stdin_fd && !job.stdin_pending.empty()) {
            ssize_t n =
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

    void read_output(uint64_t key, bool stdout_stream) {
        auto it = jobs_.find(key);
        if (it == jobs_.end()) return;
        Job& job = it->second;
        Capture& capture = stdout_stream ? job.out : job.err;
        std::string& buffer = read_buffer_;
        ssize_t n = ::read(capture.fd.get(), buffer.data(), buffer.size());
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {
            capture.fd.reset();
            if (!job.session.empty() && stdout_stream) driver_gone(job);
            maybe_finish(key);
            return;
        }
        const std::string_view chunk(buffer.data(), static_cast<size_t>(n));
        if (!job.session.empty()) {
            if (stdout_stream) {
                driver_output(job, chunk);
            } else {
                Session* session = session_of(job);
                if (session != nullptr) {
                    session->log.append(chunk);
                    if (session->log.size() > kSessionLogBytes) {
                        session->log.erase(0, session->log.size() - kSessionLogBytes);
                    }
                }
            }
            return;
        }
        const uint64_t room =
            capture.limit > capture.data.size() ? capture.limit - capture.data.size() : 0;
        if (chunk.size() > room) capture.truncated = true;
        capture.data.append(chunk.substr(0, std::min<uint64_t>(room, chunk.size())));
    }

    void handle_supervisor() {
        std::optional<FdMessage> message = receive_fd_message(control_.get());
        if (!message) {
            if (!supervisor_failed_) print_error("the sandbox supervisor went away; stopping");
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
            return;
        }
        if (message->tag == MessageTag::kFailed) {  // it failed and is exiting: say why, once
            print_error("the sandbox supervisor failed: " +
                        json::parse(message->text).value("error", std::string()) + "; stopping");
            supervisor_failed_ = true;
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
            return;
        }
        if (message->tag != MessageTag::kReport) return;
        json report = json::parse(message->text);
        const auto key = report.at("key").get<uint64_t>();
        auto it = jobs_.find(key);
        if (it == jobs_.end()) return;
        it->second.report = std::move(report);
        maybe_finish(key);
    }

    void maybe_finish(uint64_t key) {
        auto it = jobs_.find(key);
        if (it == jobs_.end()) return;
        Job& job = it->second;
        if (!job.session.empty()) {
            if (!job.report) return;
            Session* session = session_of(job);
            if (session != nullptr) {
                session_died(*session, job.report->value("error", ""));
            }
            jobs_.erase(it);
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
        if (!job.abandoned) respond(job.client, run_answer(job));
        if (job.counted) --running_runs_;
        jobs_.erase(it);
        start_waiting_runs();
    }

    json run_answer(Job& job) {
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
        const std::string error = report.value("error", "");
        if (!error.empty() && answer["exit_code"] == kExitSqboxFailure) {
            answer["error"] = error_object("SandboxError", error);
        }
        return answer;
    }

    // ---- sessions ----

    Session* session_of(const Job& job) {
        if (job.session.empty() || job.abandoned) return nullptr;
        auto it = sessions_.find(job.session);
        if (it == sessions_.end() || it->second.job != job.key) return nullptr;
        return &it->second;
    }

    void open_session(int client_id, const json& request) {
        // Everything is checked before the session exists.
        RequestSettings settings = settings_from_request(request, options_.base, true);
        std::vector<std::string> tools;
        if (request.contains("tools")) tools = request.at("tools").get<std::vector<std::string>>();
        SandboxConfig& config = settings.config;
        config.command = {"python3", kDriverPathInSandbox};
        config.timeout_seconds.reset();
        MountSpec driver;
        driver.kind = MountSpec::Kind::kBind;
        driver.source_in = MountSpec::SourceIn::kSupervisor;
        driver.source = kDriverPathInScratch;
        driver.destination = kDriverPathInSandbox;
        driver.read_only = true;
        driver.recursive = false;
        driver.create = MountSpec::Create::kFile;
        driver.origin = "the session driver";
        config.mounts.push_back(driver);

        const std::string id = "s" + std::to_string(next_session_++);
        Session& session = sessions_[id];
        session.id = id;
        session.client = client_id;
        session.tools = std::move(tools);
        session.output_limit = config.output_limit_bytes.value_or(kDefaultExecOutputLimit);
        session.settings = std::move(settings);
        session.answer_when_ready.push_back(request.value("id", json(nullptr)));
        start_session_sandbox(session);
    }

    void start_session_sandbox(Session& session) {
        Job& job = new_job(session.client, session.settings);
        job.session = session.id;
        job.keep_stdin_open = true;
        session.job = job.key;
        session.state = Session::State::kStarting;
        session.line.clear();
        session.scanned = 0;
        session.log.clear();
        launch(job);
    }

    void driver_output(Job& job, std::string_view chunk) {
        Session* session = session_of(job);
        if (session == nullptr) return;
        session->line.append(chunk);
        // As for requests: by offset, one shift of the buffer at the end.
        size_t consumed = 0;
        size_t newline;
        while ((newline = session->line.find('\n', std::max(consumed, session->scanned))) !=
               std::string::npos) {
            std::string line = session->line.substr(consumed, newline - consumed);
            consumed = newline + 1;
            // The driver shares its process with the session's code: anything may arrive here.
            try {
                handle_driver_message(*session, parse_message(line));
            } catch (const Error&) {
                // not a message of the driver's: ignored
            } catch (const json::exception&) {
                // a message with fields of the wrong types: ignored
            }
            session = session_of(job);
            if (session == nullptr) return;
        }
        session->line.erase(0, consumed);
        session->scanned = session->line.size();
        if (session->line.size() > kMaxRequestBytes) {
            kill_session_sandbox(*session, "the session driver sent an oversized message");
        }
    }

    void handle_driver_message(Session& session, json message) {
        const std::string event = message.value("event", "");
        if (event == "ready") {
            session.state = Session::State::kIdle;
            if (!session.tools.empty()) {
                session.queue.push_front(
                    {{"op", "tools"}, {"names", session.tools}, {"internal", true}});
            }
            for (const auto& id : session.answer_when_ready) {
                respond(session.client, {{"id", id}, {"ok", true}, {"session", session.id}});
            }
            session.answer_when_ready.clear();
            pump(session);
        } else if (event == "tool_call") {
            if (session.state != Session::State::kBusy || session.current_internal) return;
            const json& name = message.contains("name") ? message["name"] : json(nullptr);
            const json& call_id = message.contains("call_id") ? message["call_id"] : json(nullptr);
            if (!call_id.is_string() && !call_id.is_number_integer()) return;
            if (session.tool_call_pending) {
                // The driver waits for each answer; a second call is not the driver's doing.
                kill_session_sandbox(session,
                                     "the session broke the protocol (overlapping tool calls)");
                return;
            }
            if (!name.is_string() || std::find(session.tools.begin(), session.tools.end(),
                                               name.get<std::string>()) == session.tools.end()) {
                // Only what the client registered reaches it.
                send_to_driver(session, {{"op", "tool_result"},
                                         {"call_id", call_id},
                                         {"error", error_object("NameError", "no such tool")}});
                return;
            }
            session.tool_call_pending = true;
            json call = {
                {"id", session.current.value("id", json(nullptr))},
                {"event", "tool_call"},
                {"session", session.id},
                {"call_id", call_id},
                {"name", name},
                {"args", message.contains("args") ? message["args"] : json::array()},
                {"kwargs", message.contains("kwargs") ? message["kwargs"] : json::object()}};
            respond(session.client, call);
        } else if (event == "result") {
            if (session.state != Session::State::kBusy) return;
            session.tool_call_pending = false;
            if (!session.current_internal) {
                json answer = std::move(message);  // an exec's output may be 16 MiB
                answer.erase("event");
                answer["id"] = session.current.value("id", json(nullptr));
                if (!answer.contains("ok")) answer["ok"] = true;
                if (session.current.value("op", "") == "exec") {
                    answer["timed_out"] = session.interrupted;
                }
                respond(session.client, answer);
            }
            session.state = Session::State::kIdle;
            session.current = nullptr;
            session.current_internal = false;
            session.deadline.reset();
            session.interrupted = false;
            pump(session);
        }
    }

    void pump(Session& session) {
        if (session.state != Session::State::kIdle || session.queue.empty()) return;
        json request = std::move(session.queue.front());
        session.queue.pop_front();
        const std::string op = request.value("op", "");
        json to_driver = {{"op", op}};
        try {
            if (op == "exec") {
                to_driver["code"] = request.at("code").get<std::string>();
                uint64_t limit = session.output_limit;
                if (request.contains("output_limit")) {
                    limit = request.at("output_limit").get<uint64_t>();
                }
                to_driver["output_limit"] = limit;
                if (request.contains("timeout")) {
                    const double timeout = request.at("timeout").get<double>();
                    if (!(timeout > 0) || timeout > kMaxTimeoutSeconds) {
                        throw Error("timeout: expected a positive number of seconds (at most " +
                                    std::to_string(static_cast<long>(kMaxTimeoutSeconds)) + ")");
                    }
                    session.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(timeout));
                }
            } else if (op == "put") {
                to_driver["path"] = request.at("path").get<std::string>();
                to_driver["data_b64"] = request.at("data_b64").get<std::string>();
            } else if (op == "get") {
                to_driver["path"] = request.at("path").get<std::string>();
                if (request.contains("limit")) to_driver["limit"] = request.at("limit");
            } else if (op == "tools") {
                session.tools = request.at("names").get<std::vector<std::string>>();
                to_driver["names"] = session.tools;
            }
        } catch (const std::exception& e) {
            if (!request.value("internal", false)) {
                respond(session.client, {{"id", request.value("id", json(nullptr))},
                                         {"ok", false},
                                         {"error", error_object("BadRequest", e.what())}});
            }
            pump(session);
            return;
        }
        session.current_internal = request.value("internal", false);
        session.current = std::move(request);
        session.state = Session::State::kBusy;
        session.interrupted = false;
        session.tool_call_pending = false;
        send_to_driver(session, to_driver);
    }

    void send_to_driver(Session& session, const json& message) {
        auto it = jobs_.find(session.job);
        if (it == jobs_.end()) return;
        Job& job = it->second;
        // A driver that stops reading must not make the server hold its input forever.
        if (job.stdin_pending.size() > kMaxRequestBytes) {
            kill_session_sandbox(session, "the session stopped reading its requests");
            return;
        }
        job.stdin_pending += dump_line(message);
        write_stdin(session.job);
    }

    void forward_tool_result(int client_id, const json& request) {
        Session& session = owned_session(client_id, request);
        // Too late (the exec has ended) or never asked for: dropped.
        if (session.state != Session::State::kBusy || !session.tool_call_pending) return;
        session.tool_call_pending = false;
        json message = {{"op", "tool_result"}, {"call_id", request.at("call_id")}};
        if (request.contains("error")) {
            message["error"] = request.at("error");
        } else {
            message["result"] = request.value("result", json(nullptr));
        }
        send_to_driver(session, message);
    }

    void check_deadlines() {
        const auto now = Clock::now();
        for (auto& [id, session] : sessions_) {
            if (!session.deadline || now < *session.deadline) continue;
            auto job = jobs_.find(session.job);
            if (job == jobs_.end()) {
                session.deadline.reset();
                continue;
            }
            if (!session.interrupted) {
                // KeyboardInterrupt in the code; the driver answers and the session lives on.
                session.interrupted = true;
                session.deadline = now + kInterruptGrace;
                signal_job(job->second, SIGINT);
            } else {
                session.deadline.reset();
                kill_session_sandbox(
                    session, "the code did not stop after an interrupt; the session was killed");
            }
        }
    }

    json dead_answer(const Session& session, const json& id) {
        return {{"id", id},
                {"ok", false},
                {"session_dead", true},
                {"error", error_object("SessionDead", "session " + session.id +
                                                          " is dead: " + session.dead_reason)}};
    }

    void kill_session_sandbox(Session& session, const std::string& reason) {
        if (session.dead_reason.empty()) session.dead_reason = reason;
        auto it = jobs_.find(session.job);
        if (it != jobs_.end()) signal_job(it->second, SIGKILL);
    }

    void driver_gone(Job& job) {
        Session* session = session_of(job);
        if (session == nullptr) return;
        // The driver's channel closed: it exited or was killed. Its sandbox goes too.
        signal_job(job, SIGKILL);
        session_died(*session, "");
    }

    void session_died(Session& session, const std::string& error) {
        if (session.state == Session::State::kDead) return;
        if (session.dead_reason.empty()) {
            std::string reason = error.empty() ? "the interpreter exited" : error;
            std::string log = session.log;
            while (!log.empty() && (log.back() == '\n')) log.pop_back();
            if (!log.empty()) {
                reason +=
                    "; its last output: " + log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
            }
            session.dead_reason = reason;
        }
        const bool interrupted = session.interrupted;
        session.state = Session::State::kDead;
        session.deadline.reset();
        for (const auto& id : session.answer_when_ready) {
            respond(session.client,
                    {{"id", id},
                     {"ok", false},
                     {"error", error_object("SessionError", "the session could not start: " +
                                                                session.dead_reason)}});
        }
        session.answer_when_ready.clear();
        if (!session.current.is_null() && !session.current_internal) {
            json answer = dead_answer(session, session.current.value("id", json(nullptr)));
            if (session.current.value("op", "") == "exec") answer["timed_out"] = interrupted;
            respond(session.client, answer);
        }
        session.current = nullptr;
        for (const auto& request : session.queue) {
            if (!request.value("internal", false)) {
                respond(session.client, dead_answer(session, request.value("id", json(nullptr))));
            }
        }
        session.queue.clear();
    }

    void retire_session_job(Session& session) {
        auto it = jobs_.find(session.job);
        if (it == jobs_.end()) return;
        it->second.abandoned = true;
        it->second.stdin_fd.reset();
        signal_job(it->second, SIGKILL);
        // Its report still arrives and is dropped then; if it already has, drop the job now.
        if (it->second.report || !it->second.started) jobs_.erase(it);
    }

    // Answers every request the session still owes with `type` (SessionReset, SessionClosed).
    void cancel_pending(Session& session, const std::string& type, const std::string& message) {
        std::vector<json> ids;
        if (!session.current.is_null() && !session.current_internal &&
            session.state == Session::State::kBusy) {
            ids.push_back(session.current.value("id", json(nullptr)));
        }
        for (const auto& request : session.queue) {
            if (!request.value("internal", false)) {
                ids.push_back(request.value("id", json(nullptr)));
            }
        }
        for (const auto& id : session.answer_when_ready) ids.push_back(id);
        for (const auto& id : ids) {
            respond(session.client,
                    {{"id", id}, {"ok", false}, {"error", error_object(type, message)}});
        }
        session.queue.clear();
        session.answer_when_ready.clear();
        session.current = nullptr;
    }

    void reset_session(Session& session, const json& id) {
        std::vector<json> opening = std::move(session.answer_when_ready);
        session.answer_when_ready.clear();
        cancel_pending(session, "SessionReset", "the session was reset");
        session.answer_when_ready = std::move(opening);
        retire_session_job(session);
        session.current = nullptr;
        session.current_internal = false;
        session.deadline.reset();
        session.interrupted = false;
        session.dead_reason.clear();
        session.answer_when_ready.push_back(id);
        start_session_sandbox(session);
    }

    void destroy_session(const std::string& id) {
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return;
        cancel_pending(it->second, "SessionClosed", "the session was closed");
        retire_session_job(it->second);
        sessions_.erase(it);
    }

    // ---- the end ----

    void shut_down() {
        // Every sandbox dies with the supervisor (each init has it as its death signal).
        control_.reset();
        supervisor_.kill_and_reap();
        for (auto& [id, client] : clients_) {
            if (client.broken || client.out.empty()) continue;
            const int flags = ::fcntl(client.out_fd, F_GETFL);
            if (flags >= 0) (void)::fcntl(client.out_fd, F_SETFL, flags & ~O_NONBLOCK);
            (void)write_all(client.out_fd, client.out.data(), client.out.size());
        }
        jobs_.clear();  // cgroups are removed now that their processes are gone
        if (socket_bound_) (void)::unlink(options_.socket_path.c_str());
    }

    const ServeOptions& options_;
    std::string read_buffer_ = std::string(kReadChunk, '\0');
    unsigned max_parallel_ = 1;
    ImageSource image_;
    UniqueFd parent_;
    UniqueFd control_;
    ChildProcess supervisor_;
    UniqueFd listener_;
    bool socket_bound_ = false;
    std::map<int, Client> clients_;
    std::map<uint64_t, Job> jobs_;
    std::map<std::string, Session> sessions_;
    std::deque<uint64_t> waiting_runs_;
    std::deque<uint64_t> pool_ready_;
    bool pool_enabled_ = true;
    unsigned pool_failures_ = 0;
    unsigned running_runs_ = 0;
    uint64_t next_key_ = 1;
    uint64_t next_session_ = 1;
    int next_client_ = 0;
    bool stopping_ = false;
    bool draining_ = false;
    bool supervisor_failed_ = false;
    int exit_status_ = 0;
};

}  // namespace

int run_server(const ServeOptions& options) {
    try {
        struct sigaction ignore {};
        ignore.sa_handler = SIG_IGN;
        (void)::sigaction(SIGPIPE, &ignore, nullptr);
        ScopedSignalBlock block;
        Server server(options);
        return server.run();
    } catch (const Error& e) {
        print_error(e.what());
        return kExitSqboxFailure;
    }
}

}  // namespace sqbox

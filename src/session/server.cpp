#include "session/server.h"

#include <poll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "image/image_source.h"
#include "runtime/image_access.h"
#include "runtime/launcher.h"
#include "runtime/sandbox_plan.h"
#include "runtime/signals.h"
#include "runtime/user_namespace.h"
#include "security/zygote_seccomp.h"
#include "session/client_connection.h"
#include "session/jobs.h"
#include "session/output_events.h"
#include "session/process_requests.h"
#include "session/protocol_lines.h"
#include "session/request_config.h"
#include "session/session_driver.h"
#include "session/session_extras.h"
#include "session/session_state.h"
#include "session/supervisor_messages.h"
#include "session/warm_supervisor.h"
#include "session/zygote.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/process.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kServerVersion = "sqbox 0.1.0, protocol 1";
constexpr size_t kReadChunk = size_t{256} * 1024;

// A session as the server holds it: its state machine, whose client it is, its sandbox's job.
struct OpenSession {
    OpenSession(std::string id, SessionPort& port, int client_id, RequestSettings sandbox,
                std::vector<std::string> tools, uint64_t output_limit)
        : client(client_id),
          settings(std::move(sandbox)),
          state(std::move(id), port, std::move(tools), output_limit) {}

    int client;
    uint64_t job = 0;
    RequestSettings settings;  // its sandbox's, from session_open (reset starts the same again)
    Session state;
};

// The server's lifetime and wiring: start-up, the poll loop, signals, the end; requests go to
// the jobs (jobs.h) and the sessions (session_state.h), and their answers to the clients
// (client_connection.h).
class Server final : private SessionPort, private JobEvents {
  public:
    explicit Server(const ServeOptions& options) : options_(options), jobs_(options, *this) {}
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    int run() {
        watch_parent();
        start_supervisor();
        if (!options_.socket_path.empty()) listen_on_socket();
        clients_.emplace(next_client_++, ClientConnection::stdio());
        jobs_.fill_pool();
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
        parent_ = open_pidfd(parent);
        if (!parent_) throw system_error("pidfd_open of the parent process");
        if (::getppid() != parent) stopping_ = true;  // it is already gone
    }

    // ---- the warm supervisor ----

    void start_supervisor() {
        image_ = open_image(options_.base.image);
        // Without /dev/fuse (a pod), a .sqsh is served from a copy unpacked into the cache, held
        // for the server's life (docs/pods.md).
        image_access_ = choose_image_access(image_, options_.base);
        WarmSupervisorContext context;
        context.image = &image_;
        context.base = &options_.base;
        context.plan_template = build_sandbox_plan(options_.base);
        if (options_.zygote) {
            context.zygote_seccomp = compile_zygote_seccomp_filter(options_.base.seccomp_profile);
            jobs_.set_zygote_settings(zygote_settings(context.plan_template, options_.base));
        }
        context.driver_source = std::string(session_driver_source());
        auto [control, supervisor_end] = make_message_channel("the supervisor's channel");
        control_ = std::move(control);
        context.control_fd = supervisor_end.get();
        context.server_pid = ::getpid();
        pid_t pid = clone_into_user_namespace(CLONE_NEWNS, "the sandbox's user namespace");
        if (pid == 0) {
            control_.reset();
            run_warm_supervisor(context);
        }
        supervisor_ = ChildProcess(pid);
        supervisor_end.reset();
        std::optional<FdMessage> ready = receive_fd_message(control_.get());
        if (!ready) throw Error("the sandbox supervisor died while mounting the image");
        if (ready->tag == MessageTag::kFailed) {
            std::string error;
            try {
                error = parse_supervisor_message(ready->tag, ready->text).value("error", "");
            } catch (const Error& e) {
                error = std::string("it sent a malformed message: ") + e.what();
            }
            throw Error("the sandbox supervisor failed to start: " + error);
        }
        jobs_.connect_supervisor(control_.get());
    }

    void handle_supervisor() {
        std::optional<FdMessage> message = receive_fd_message(control_.get());
        if (!message) {
            if (!supervisor_failed_) print_error("the sandbox supervisor went away; stopping");
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
            return;
        }
        if (message->tag != MessageTag::kFailed && message->tag != MessageTag::kReport) return;
        json body;
        try {
            body = parse_supervisor_message(message->tag, message->text);
        } catch (const Error& e) {
            print_error(std::string("the sandbox supervisor sent a malformed message (") +
                        e.what() + "); stopping");
            supervisor_failed_ = true;
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
            return;
        }
        if (message->tag == MessageTag::kFailed) {  // it failed and is exiting: say why, once
            print_error("the sandbox supervisor failed: " + body.value("error", std::string()) +
                        "; stopping");
            supervisor_failed_ = true;
            exit_status_ = kExitSqboxFailure;
            stopping_ = true;
            return;
        }
        jobs_.take_report(std::move(body));
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
        clients_.emplace(next_client_++, ClientConnection(std::move(fd)));
    }

    // ---- the loop ----

    void loop() {
        sigset_t signals = pipeline_signals();
        UniqueFd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
        if (!signal_fd) throw system_error("signalfd");
        std::vector<pollfd> fds;
        std::vector<std::function<void(short)>> handlers;
        const PollWatch watch = [&](int fd, short events, std::function<void(short)> handler) {
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
                if (!client.input_closed()) {
                    watch(client.in_fd(), POLLIN,
                          [this, client_id](short) { read_client(client_id); });
                }
                if (!client.broken()) {
                    // With nothing to write, events 0 still reports POLLERR: the reader is gone.
                    const short events = client.has_output() ? POLLOUT : 0;
                    watch(client.out_fd(), events, [this, client_id](short revents) {
                        clients_.at(client_id).output_ready(revents);
                    });
                }
            }
            jobs_.watch(watch);
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
        if (jobs_.runs_under_way()) return false;
        return std::none_of(sessions_.begin(), sessions_.end(),
                            [](const auto& entry) { return entry.second.state.has_work(); });
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
        for (const auto& [id, entry] : sessions_) {
            const auto deadline = entry.state.deadline();
            if (deadline && (!nearest || *deadline < *nearest)) nearest = deadline;
        }
        const auto job_deadline = jobs_.next_deadline();
        if (job_deadline && (!nearest || *job_deadline < *nearest)) nearest = job_deadline;
        if (!nearest) return -1;
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*nearest - Clock::now()).count();
        return static_cast<int>(std::max<long long>(0, ms));
    }

    void check_deadlines() {
        const auto now = Clock::now();
        for (auto& [id, entry] : sessions_) {
            entry.state.check_deadline(now, client_backlogged(entry.client));
        }
        jobs_.check_deadlines(now);
    }

    // ---- clients ----

    void read_client(int client_id) {
        ClientConnection& client = clients_.at(client_id);
        client.read_available(read_buffer_);
        std::string line;
        while (client.next_line(line)) {
            if (!line.empty()) handle_line(client_id, line);
            if (clients_.find(client_id) == clients_.end()) return;
        }
        if (client.drop_oversized_input()) {
            respond(client_id, {{"id", nullptr},
                                {"ok", false},
                                {"error", error_object("BadRequest", "request line too long")}});
        }
        if (client.input_closed() && !client.is_socket() && options_.socket_path.empty()) {
            // No more requests can come: answer what is under way, then stop.
            draining_ = true;
        }
    }

    void respond(int client_id, const json& message) {
        auto it = clients_.find(client_id);
        if (it != clients_.end()) it->second.send(message);
    }

    void drop_gone_clients() {
        for (auto it = clients_.begin(); it != clients_.end();) {
            if (!it->second.gone()) {
                ++it;
                continue;
            }
            const int client_id = it->first;
            jobs_.abandon_runs_of(client_id);
            std::vector<std::string> owned;
            for (auto& [id, entry] : sessions_) {
                if (entry.client == client_id) owned.push_back(id);
            }
            for (const auto& id : owned) destroy_session(id);
            if (!it->second.is_socket() && options_.socket_path.empty()) stopping_ = true;
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
            if (op == "run" || op == "run_python") {
                jobs_.start_run(client_id, request, op == "run_python");
            } else if (op == "session_open") {
                open_session(client_id, request);
            } else if (op == "exec" || op == "put" || op == "get" || op == "tools" ||
                       is_process_op(op) || is_session_extra_op(op)) {
                Session& session = owned_session(client_id, request);
                session.submit(std::move(request));  // a put's may be tens of MiB
            } else if (op == "tool_result") {
                owned_session(client_id, request).tool_result(request);
            } else if (op == "reset") {
                owned_session(client_id, request).reset(id);
            } else if (op == "close") {
                const std::string session_id = owned_session(client_id, request).id();
                destroy_session(session_id);
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
        return it->second.state;
    }

    // ---- sessions ----

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
        const uint64_t output_limit =
            config.output_limit_bytes.value_or(Session::kDefaultExecOutputLimit);

        const std::string id = "s" + std::to_string(next_session_++);
        OpenSession& entry = sessions_
                                 .try_emplace(id, id, static_cast<SessionPort&>(*this), client_id,
                                              std::move(settings), std::move(tools), output_limit)
                                 .first->second;
        entry.state.set_transfer_budget(entry.settings.config.tmpfs_size_bytes);
        entry.state.open(request.value("id", json(nullptr)));
    }

    // The session whose sandbox `job` is, if it still is.
    OpenSession* session_of(const Job& job) {
        if (job.session.empty() || job.abandoned) return nullptr;
        auto it = sessions_.find(job.session);
        if (it == sessions_.end() || it->second.job != job.key) return nullptr;
        return &it->second;
    }

    void destroy_session(const std::string& id) {
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return;
        it->second.state.close();
        sessions_.erase(it);
    }

    // SessionPort: what a session's state machine asks of the server.

    void answer(Session& session, const json& message) override {
        respond(sessions_.at(session.id()).client, message);
    }

    void send_to_driver(Session& session, const json& message) override {
        const uint64_t job = sessions_.at(session.id()).job;
        if (!jobs_.contains(job)) return;
        // A driver that stops reading must not make the server hold its input forever.
        if (!jobs_.feed_stdin(job, dump_line(message))) {
            session.kill("the session stopped reading its requests");
        }
    }

    void signal_sandbox(Session& session, int signal) override {
        jobs_.signal(sessions_.at(session.id()).job, signal);
    }

    bool has_sandbox(const Session& session) const override {
        return jobs_.contains(sessions_.at(session.id()).job);
    }

    void start_sandbox(Session& session) override {
        OpenSession& entry = sessions_.at(session.id());
        // The session learns its job before the launch: a launch that fails reports at once.
        entry.job = jobs_.add_session_job(entry.client, session.id(), entry.settings);
        jobs_.launch(entry.job);
    }

    void retire_sandbox(Session& session) override { jobs_.retire(sessions_.at(session.id()).job); }

    // JobEvents: what comes of the sandboxes.

    void run_finished(int client_id, const json& answer) override { respond(client_id, answer); }

    void run_output(int client_id, const json& event) override { respond(client_id, event); }

    bool client_backlogged(int client_id) const override {
        auto it = clients_.find(client_id);
        return it != clients_.end() && it->second.pending_output() > kClientBacklogBytes;
    }

    void session_output(const Job& job, std::string_view chunk) override {
        if (OpenSession* entry = session_of(job)) entry->state.driver_output(chunk);
    }

    void session_log(const Job& job, std::string_view chunk) override {
        if (OpenSession* entry = session_of(job)) entry->state.driver_log(chunk);
    }

    void session_output_closed(const Job& job) override {
        if (OpenSession* entry = session_of(job)) entry->state.driver_gone();
    }

    void session_sandbox_ended(const Job& job, const std::string& error) override {
        if (OpenSession* entry = session_of(job)) entry->state.sandbox_ended(error);
    }

    // ---- the end ----

    void shut_down() {
        // Every sandbox dies with the supervisor (each init has it as its death signal).
        control_.reset();
        supervisor_.kill_and_reap();
        for (auto& [id, client] : clients_) client.flush_blocking();
        jobs_.clear();  // cgroups are removed now that their processes are gone
        if (socket_bound_) (void)::unlink(options_.socket_path.c_str());
    }

    const ServeOptions& options_;
    std::string read_buffer_ = std::string(kReadChunk, '\0');
    ImageSource image_;
    ImageAccess image_access_;
    UniqueFd parent_;
    UniqueFd control_;
    ChildProcess supervisor_;
    UniqueFd listener_;
    bool socket_bound_ = false;
    std::map<int, ClientConnection> clients_;
    Jobs jobs_;
    std::map<std::string, OpenSession> sessions_;
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
    } catch (const std::exception& e) {  // a bug: the sandboxes still go (~Server), and we say so
        print_error(std::string("internal error: ") + e.what());
        return kExitSqboxFailure;
    }
}

}  // namespace sqbox

// One session of `sqbox serve` (PROTOCOL.md, "Sessions"): a Python interpreter in a sandbox, the
// requests its client queued for it, and the traffic with the driver inside.
//
// The state machine knows no descriptors and no sandboxes: the server feeds it the client's
// requests and the driver's output, and it acts through a SessionPort (answers to the client,
// lines to the driver, signals and the sandbox's start). A unit test drives it with a fake port.
//
//   kStarting --ready--> kIdle --a request--> kBusy --result--> kIdle ...
//   any state --the sandbox ends or the driver's channel closes--> kDead (until reset)
//
// The driver shares its process with the session's code, which can write on the driver's
// channel too. Each sandbox's driver gets a random token in its first line (`hello`, before any
// code runs) and every request a random number (`seq`); the driver's messages carry both, and the
// session takes only a `ready` while starting and only a result or tool call of the request it is
// serving. A line forged without the token is ignored; one forged with it (the code read the
// driver's memory) can at most answer the request it runs in: the real result of that request
// comes later with a stale number and is dropped, and the next request's number is not known
// before the driver reads it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "session/protocol_lines.h"

namespace sqbox {

class Session;

// What a session asks of the server that holds its client and its sandbox.
class SessionPort {
  public:
    // A message to the session's client (an answer or a tool call).
    virtual void answer(Session& session, const json& message) = 0;
    // A message to the driver, on its stdin. The port may kill() the session when the driver
    // has stopped reading.
    virtual void send_to_driver(Session& session, const json& message) = 0;
    // Signals the session's sandbox (SIGINT: interrupt the code; SIGKILL: end it).
    virtual void signal_sandbox(Session& session, int signal) = 0;
    virtual bool has_sandbox(const Session& session) const = 0;
    // Starts a new sandbox with the driver (the session is kStarting); a failure to start is
    // reported back at once through sandbox_ended().
    virtual void start_sandbox(Session& session) = 0;
    // Kills the session's sandbox and forgets it: nothing of it reaches the session any more.
    virtual void retire_sandbox(Session& session) = 0;

  protected:
    ~SessionPort() = default;
};

class Session {
  public:
    enum class State { kStarting, kIdle, kBusy, kDead };
    using Clock = std::chrono::steady_clock;

    // Each exec's cap per output stream when neither the session nor the exec sets one.
    static constexpr uint64_t kDefaultExecOutputLimit = 1024ULL * 1024;
    // How long interrupted code has to come back before its sandbox is killed. Its answer can
    // carry the exec's whole output (tens of MiB, encoded by the driver after its last event):
    // 2 s was too little for that on a loaded or slow VM (test_a_flooding_exec_grows_neither_side
    // failed 1 run in 3 there).
    static constexpr auto kInterruptGrace = std::chrono::seconds(5);
    // Longer timeouts would overflow the clock arithmetic; a week is plenty.
    static constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;
    // The tail of the driver's stderr kept to say why a session died.
    static constexpr size_t kLogBytes = size_t{64} * 1024;

    Session(std::string id, SessionPort& port, std::vector<std::string> tools,
            uint64_t output_limit);
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    // ---- the client's side ----

    // Starts the sandbox; `request_id` (the session_open's) is answered once the driver is ready.
    void open(const json& request_id);
    // exec, put, get or tools: served in order, one at a time. A dead session answers at once.
    void submit(json request);
    // The client's answer to a tool call; dropped when it is not for the call awaited (a late
    // answer). One without a usable call_id fails the awaited call, so that the driver does not
    // wait for ever, and throws Error (the client's request was malformed).
    void tool_result(const json& request);
    // A fresh sandbox, same id and tools; what is pending is answered SessionReset.
    void reset(const json& request_id);
    // Answers what is pending with SessionClosed and retires the sandbox.
    void close();

    // ---- the sandbox's side ----

    // Bytes from the driver's stdout: protocol lines.
    void driver_output(std::string_view chunk);
    // Bytes from the driver's stderr: kept (the tail) to say why the session died.
    void driver_log(std::string_view chunk);
    // The driver's stdout closed: it exited or was killed. Its sandbox goes too.
    void driver_gone();
    // The sandbox ended; `error` is the supervisor's reason, if any.
    void sandbox_ended(const std::string& error);
    // Interrupts an exec past its timeout, and kills the sandbox once the grace has passed too.
    // `driver_held`: the server is not reading the driver (its client is behind with streamed
    // output), so the interrupted code's answer cannot arrive yet: the grace starts again.
    void check_deadline(Clock::time_point now, bool driver_held = false);
    // Kills the sandbox; `reason` is what the session's dead answers will say.
    void kill(const std::string& reason);

    // The sandbox's writable bytes: the bound of each upload and download stream.
    void set_transfer_budget(uint64_t bytes) { transfer_budget_ = bytes; }

    const std::string& id() const { return id_; }
    State state() const { return state_; }
    std::optional<Clock::time_point> deadline() const { return deadline_; }
    // Starting, serving or holding requests (and not dead): the server is not idle.
    bool has_work() const;

  private:
    void start();
    bool from_this_driver(const json& message) const;
    bool for_current_request(const json& message) const;
    void handle_driver_message(json message);
    void tool_call(const json& message);
    void output(const json& message);
    void result(json message);
    void pump();
    void died(const std::string& error);
    void cancel_pending(const std::string& type, const std::string& message);
    json dead_answer(const json& id) const;

    std::string id_;
    SessionPort& port_;
    State state_ = State::kStarting;
    std::deque<json> queue_;
    json current_;  // the request the driver is serving, null when idle
    bool current_internal_ = false;
    bool current_streams_ = false;  // an exec that asked for its output as events
    std::optional<Clock::time_point> deadline_;
    bool interrupted_ = false;
    std::vector<std::string> tools_;
    bool tool_call_pending_ = false;       // the driver waits for the client's answer...
    json pending_call_id_;                 // ...to this call
    std::string token_;                    // this sandbox's driver's, from the hello
    uint64_t current_seq_ = 0;             // the number of the request being served (or last)
    uint64_t output_limit_;                // each exec's default cap per stream
    std::vector<json> answer_when_ready_;  // ids of a session_open and resets
    LineBuffer driver_lines_;              // from the driver's stdout
    std::string log_;                      // tail of the driver's stderr
    std::string dead_reason_;
    uint64_t transfer_budget_ = uint64_t{1} << 30;
    uint64_t download_offset_ = 0;  // where the download chunk being served starts
};

}  // namespace sqbox

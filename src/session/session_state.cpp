#include "session/session_state.h"

#include <algorithm>
#include <csignal>
#include <exception>

#include "util/errors.h"

namespace sqbox {

Session::Session(std::string id, SessionPort& port, std::vector<std::string> tools,
                 uint64_t output_limit)
    : id_(std::move(id)), port_(port), tools_(std::move(tools)), output_limit_(output_limit) {}

bool Session::has_work() const {
    if (state_ == State::kDead) return false;
    return state_ == State::kStarting || state_ == State::kBusy || !queue_.empty();
}

// ---- the client's side ----

void Session::open(const json& request_id) {
    answer_when_ready_.push_back(request_id);
    start();
}

void Session::start() {
    state_ = State::kStarting;
    driver_lines_.clear();
    log_.clear();
    port_.start_sandbox(*this);
}

void Session::submit(json request) {
    if (state_ == State::kDead) {
        port_.answer(*this, dead_answer(request.value("id", json(nullptr))));
        return;
    }
    queue_.push_back(std::move(request));  // a put's may be tens of MiB
    pump();
}

void Session::tool_result(const json& request) {
    // Too late (the exec has ended) or never asked for: dropped.
    if (state_ != State::kBusy || !tool_call_pending_) return;
    tool_call_pending_ = false;
    json message = {{"op", "tool_result"}, {"call_id", request.at("call_id")}};
    if (request.contains("error")) {
        message["error"] = request.at("error");
    } else {
        message["result"] = request.value("result", json(nullptr));
    }
    port_.send_to_driver(*this, message);
}

void Session::reset(const json& request_id) {
    // A session_open still waiting for its driver is answered by the new one.
    std::vector<json> opening = std::move(answer_when_ready_);
    answer_when_ready_.clear();
    cancel_pending("SessionReset", "the session was reset");
    answer_when_ready_ = std::move(opening);
    port_.retire_sandbox(*this);
    current_ = nullptr;
    current_internal_ = false;
    deadline_.reset();
    interrupted_ = false;
    dead_reason_.clear();
    answer_when_ready_.push_back(request_id);
    start();
}

void Session::close() {
    cancel_pending("SessionClosed", "the session was closed");
    port_.retire_sandbox(*this);
}

// Answers every request the session still owes with `type` (SessionReset, SessionClosed).
void Session::cancel_pending(const std::string& type, const std::string& message) {
    std::vector<json> ids;
    if (!current_.is_null() && !current_internal_ && state_ == State::kBusy) {
        ids.push_back(current_.value("id", json(nullptr)));
    }
    for (const auto& request : queue_) {
        if (!request.value("internal", false)) ids.push_back(request.value("id", json(nullptr)));
    }
    for (const auto& id : answer_when_ready_) ids.push_back(id);
    for (const auto& id : ids) {
        port_.answer(*this, {{"id", id}, {"ok", false}, {"error", error_object(type, message)}});
    }
    queue_.clear();
    answer_when_ready_.clear();
    current_ = nullptr;
}

// Hands the next queued request to the driver when it is free.
void Session::pump() {
    if (state_ != State::kIdle || queue_.empty()) return;
    json request = std::move(queue_.front());
    queue_.pop_front();
    const std::string op = request.value("op", "");
    json to_driver = {{"op", op}};
    try {
        if (op == "exec") {
            to_driver["code"] = request.at("code").get<std::string>();
            uint64_t limit = output_limit_;
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
                deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(timeout));
            }
        } else if (op == "put") {
            to_driver["path"] = request.at("path").get<std::string>();
            to_driver["data_b64"] = request.at("data_b64").get<std::string>();
        } else if (op == "get") {
            to_driver["path"] = request.at("path").get<std::string>();
            if (request.contains("limit")) to_driver["limit"] = request.at("limit");
        } else if (op == "tools") {
            tools_ = request.at("names").get<std::vector<std::string>>();
            to_driver["names"] = tools_;
        }
    } catch (const std::exception& e) {
        if (!request.value("internal", false)) {
            port_.answer(*this, {{"id", request.value("id", json(nullptr))},
                                 {"ok", false},
                                 {"error", error_object("BadRequest", e.what())}});
        }
        pump();
        return;
    }
    current_internal_ = request.value("internal", false);
    current_ = std::move(request);
    state_ = State::kBusy;
    interrupted_ = false;
    tool_call_pending_ = false;
    port_.send_to_driver(*this, to_driver);
}

// ---- the sandbox's side ----

void Session::driver_output(std::string_view chunk) {
    driver_lines_.append(chunk);
    std::string line;
    while (driver_lines_.next_line(line)) {
        // The driver shares its process with the session's code: anything may arrive here.
        try {
            handle_driver_message(parse_message(line));
        } catch (const Error&) {
            // not a message of the driver's: ignored
        } catch (const json::exception&) {
            // a message with fields of the wrong types: ignored
        }
    }
    if (driver_lines_.compact() > kMaxRequestBytes) {
        kill("the session driver sent an oversized message");
    }
}

void Session::handle_driver_message(json message) {
    const std::string event = message.value("event", "");
    if (event == "ready") {
        state_ = State::kIdle;
        if (!tools_.empty()) {
            queue_.push_front({{"op", "tools"}, {"names", tools_}, {"internal", true}});
        }
        for (const auto& id : answer_when_ready_) {
            port_.answer(*this, {{"id", id}, {"ok", true}, {"session", id_}});
        }
        answer_when_ready_.clear();
        pump();
    } else if (event == "tool_call") {
        tool_call(message);
    } else if (event == "result") {
        result(std::move(message));
    }
}

void Session::tool_call(const json& message) {
    if (state_ != State::kBusy || current_internal_) return;
    const json& name = message.contains("name") ? message["name"] : json(nullptr);
    const json& call_id = message.contains("call_id") ? message["call_id"] : json(nullptr);
    if (!call_id.is_string() && !call_id.is_number_integer()) return;
    if (tool_call_pending_) {
        // The driver waits for each answer; a second call is not the driver's doing.
        kill("the session broke the protocol (overlapping tool calls)");
        return;
    }
    if (!name.is_string() ||
        std::find(tools_.begin(), tools_.end(), name.get<std::string>()) == tools_.end()) {
        // Only what the client registered reaches it.
        port_.send_to_driver(*this, {{"op", "tool_result"},
                                     {"call_id", call_id},
                                     {"error", error_object("NameError", "no such tool")}});
        return;
    }
    tool_call_pending_ = true;
    json call = {{"id", current_.value("id", json(nullptr))},
                 {"event", "tool_call"},
                 {"session", id_},
                 {"call_id", call_id},
                 {"name", name},
                 {"args", message.contains("args") ? message["args"] : json::array()},
                 {"kwargs", message.contains("kwargs") ? message["kwargs"] : json::object()}};
    port_.answer(*this, call);
}

void Session::result(json message) {
    if (state_ != State::kBusy) return;
    tool_call_pending_ = false;
    if (!current_internal_) {
        json answer = std::move(message);  // an exec's output may be 16 MiB
        answer.erase("event");
        answer["id"] = current_.value("id", json(nullptr));
        if (!answer.contains("ok")) answer["ok"] = true;
        if (current_.value("op", "") == "exec") answer["timed_out"] = interrupted_;
        port_.answer(*this, answer);
    }
    state_ = State::kIdle;
    current_ = nullptr;
    current_internal_ = false;
    deadline_.reset();
    interrupted_ = false;
    pump();
}

void Session::driver_log(std::string_view chunk) {
    log_.append(chunk);
    if (log_.size() > kLogBytes) log_.erase(0, log_.size() - kLogBytes);
}

void Session::driver_gone() {
    port_.signal_sandbox(*this, SIGKILL);
    died("");
}

void Session::sandbox_ended(const std::string& error) {
    died(error);
}

void Session::check_deadline(Clock::time_point now) {
    if (!deadline_ || now < *deadline_) return;
    if (!port_.has_sandbox(*this)) {
        deadline_.reset();
        return;
    }
    if (!interrupted_) {
        // KeyboardInterrupt in the code; the driver answers and the session lives on.
        interrupted_ = true;
        deadline_ = now + kInterruptGrace;
        port_.signal_sandbox(*this, SIGINT);
    } else {
        deadline_.reset();
        kill("the code did not stop after an interrupt; the session was killed");
    }
}

void Session::kill(const std::string& reason) {
    if (dead_reason_.empty()) dead_reason_ = reason;
    port_.signal_sandbox(*this, SIGKILL);
}

json Session::dead_answer(const json& id) const {
    return {{"id", id},
            {"ok", false},
            {"session_dead", true},
            {"error", error_object("SessionDead", "session " + id_ + " is dead: " + dead_reason_)}};
}

void Session::died(const std::string& error) {
    if (state_ == State::kDead) return;
    if (dead_reason_.empty()) {
        std::string reason = error.empty() ? "the interpreter exited" : error;
        std::string log = log_;
        while (!log.empty() && (log.back() == '\n')) log.pop_back();
        if (!log.empty()) {
            reason += "; its last output: " + log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
        }
        dead_reason_ = reason;
    }
    const bool interrupted = interrupted_;
    state_ = State::kDead;
    deadline_.reset();
    for (const auto& id : answer_when_ready_) {
        port_.answer(*this,
                     {{"id", id},
                      {"ok", false},
                      {"error", error_object("SessionError",
                                             "the session could not start: " + dead_reason_)}});
    }
    answer_when_ready_.clear();
    if (!current_.is_null() && !current_internal_) {
        json answer = dead_answer(current_.value("id", json(nullptr)));
        if (current_.value("op", "") == "exec") answer["timed_out"] = interrupted;
        port_.answer(*this, answer);
    }
    current_ = nullptr;
    for (const auto& request : queue_) {
        if (!request.value("internal", false)) {
            port_.answer(*this, dead_answer(request.value("id", json(nullptr))));
        }
    }
    queue_.clear();
}

}  // namespace sqbox

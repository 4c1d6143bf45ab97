#include "session/session_state.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <exception>

#include "session/output_events.h"
#include "session/process_requests.h"
#include "session/session_extras.h"
#include "util/errors.h"
#include "util/random_bytes.h"
#include "util/text.h"

namespace sqbox {
namespace {

// 128 random bits, as hex: what the code in the session would have to read from the driver's
// memory to write messages the server takes for the driver's.
std::string random_token() {
    return hex_of(random_bytes<16>());
}

// A request's number: random (63 bits, exact in any JSON reader), so that code that has read the
// number of the request it runs in cannot tell the next one's.
uint64_t random_request_number(uint64_t previous) {
    for (;;) {
        uint64_t number = 0;
        for (const unsigned char byte : random_bytes<8>()) number = (number << 8) | byte;
        number >>= 1;
        if (number != 0 && number != previous) return number;
    }
}

}  // namespace

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
    token_ = random_token();
    port_.start_sandbox(*this);
    // The first line the driver reads, before any of the session's code runs. (A sandbox that
    // failed to start has made the session dead already.)
    if (state_ == State::kStarting) {
        port_.send_to_driver(*this, {{"op", "hello"}, {"token", token_}});
    }
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
    const auto call_id = request.find("call_id");
    const bool usable_id =
        call_id != request.end() && (call_id->is_string() || call_id->is_number_integer());
    // Too late (the exec has ended, or the answer is to an earlier call) or never asked for:
    // dropped.
    if (state_ != State::kBusy || !tool_call_pending_) {
        if (!usable_id) throw Error("tool_result: 'call_id' must be a string or an integer");
        return;
    }
    if (!usable_id) {
        // Only one call can be awaited: this answer is for it, and cannot be passed on.
        tool_call_pending_ = false;
        port_.send_to_driver(
            *this, {{"op", "tool_result"},
                    {"call_id", pending_call_id_},
                    {"error", error_object("BadToolResult",
                                           "the client's answer to this call was malformed")}});
        throw Error("tool_result: 'call_id' must be a string or an integer");
    }
    if (*call_id != pending_call_id_) return;
    tool_call_pending_ = false;
    json message = {{"op", "tool_result"}, {"call_id", *call_id}};
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
            if (request.contains("stream") && request.at("stream").get<bool>()) {
                to_driver["stream"] = true;
            }
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
        } else if (is_process_op(op)) {
            to_driver = process_request_for_driver(request);
        } else if (is_session_extra_op(op)) {
            std::optional<double> timeout;
            to_driver = session_extra_request(request, transfer_budget_, output_limit_, timeout);
            if (timeout) {
                // A backstop: the driver interrupts the command itself.
                deadline_ =
                    Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(*timeout + kShellTimeoutGraceSeconds));
            }
            if (op == "download") download_offset_ = to_driver.at("offset").get<uint64_t>();
        }
    } catch (const std::exception& e) {
        const bool too_large = dynamic_cast<const TransferTooLarge*>(&e) != nullptr;
        if (!request.value("internal", false)) {
            port_.answer(
                *this, {{"id", request.value("id", json(nullptr))},
                        {"ok", false},
                        {"error", error_object(too_large ? "TooLarge" : "BadRequest", e.what())}});
        }
        deadline_.reset();
        pump();
        return;
    }
    current_internal_ = request.value("internal", false);
    current_streams_ = to_driver.value("stream", false);
    current_ = std::move(request);
    state_ = State::kBusy;
    interrupted_ = false;
    tool_call_pending_ = false;
    current_seq_ = random_request_number(current_seq_);
    to_driver["seq"] = current_seq_;
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

// Carries this sandbox's token: the driver's, or a forgery by code that read the driver's memory.
bool Session::from_this_driver(const json& message) const {
    const auto token = message.find("token");
    if (token == message.end() || !token->is_string()) return false;
    const auto& text = token->get_ref<const std::string&>();
    if (text.size() != token_.size()) return false;
    unsigned char differ = 0;  // all bytes compared: the time taken says nothing of the token
    for (size_t i = 0; i < text.size(); ++i) {
        differ |= static_cast<unsigned char>(text[i] ^ token_[i]);
    }
    return differ == 0;
}

bool Session::for_current_request(const json& message) const {
    const auto seq = message.find("seq");
    return state_ == State::kBusy && seq != message.end() && seq->is_number_unsigned() &&
           seq->get<uint64_t>() == current_seq_;
}

void Session::handle_driver_message(json message) {
    if (!from_this_driver(message)) return;
    const std::string event = message.value("event", "");
    if (event == "ready") {
        if (state_ != State::kStarting) return;  // the driver says it once, before any code runs
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
    } else if (event == "output") {
        output(message);
    }
}

// Output of the running exec, as the driver reads it from the code's capture files.
void Session::output(const json& message) {
    if (!for_current_request(message) || current_internal_ || !current_streams_) return;
    const auto stream = message.find("stream");
    const auto data = message.find("data");
    if (stream == message.end() || data == message.end() || !data->is_string() ||
        (*stream != "stdout" && *stream != "stderr")) {
        return;
    }
    if (interrupted_ && deadline_) {
        // Interrupted code whose output is still coming (the client takes it slowly): the
        // driver is alive, its answer follows the output. The output is capped, so this ends.
        *deadline_ = std::max(*deadline_, Clock::now() + kInterruptGrace);
    }
    json event = output_event(current_.value("id", json(nullptr)), stream->get<std::string>(),
                              data->get_ref<const std::string&>(), false);
    event["session"] = id_;
    port_.answer(*this, event);
}

void Session::tool_call(const json& message) {
    const json& name = message.contains("name") ? message["name"] : json(nullptr);
    const json& call_id = message.contains("call_id") ? message["call_id"] : json(nullptr);
    if (!call_id.is_string() && !call_id.is_number_integer()) return;
    if (!for_current_request(message)) {
        // Code whose request was answered already (by a forged result) goes on calling tools:
        // refused, so that its driver does not wait for an answer that never comes.
        port_.send_to_driver(
            *this, {{"op", "tool_result"},
                    {"call_id", call_id},
                    {"error", error_object("RequestAnswered",
                                           "the request this code runs for was answered")}});
        return;
    }
    if (current_internal_) return;
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
    pending_call_id_ = call_id;
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
    if (!for_current_request(message)) return;  // stale: its request was answered already
    tool_call_pending_ = false;
    if (!current_internal_) {
        json answer = std::move(message);  // an exec's output may be 16 MiB
        answer.erase("event");
        answer.erase("token");
        answer.erase("seq");
        answer["id"] = current_.value("id", json(nullptr));
        if (!answer.contains("ok")) answer["ok"] = true;
        if (current_.value("op", "") == "exec") answer["timed_out"] = interrupted_;
        if (current_.value("op", "") == "download" && answer.value("ok", false) == true &&
            !download_answer_within_budget(answer, download_offset_, transfer_budget_)) {
            // The driver went on past the budget (or sent no data): the stream ends here.
            answer = {{"ok", false},
                      {"error", error_object("TooLarge",
                                             "the download would pass the sandbox's writable "
                                             "budget of " +
                                                 std::to_string(transfer_budget_) + " bytes")}};
            answer["id"] = current_.value("id", json(nullptr));
        }
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

void Session::check_deadline(Clock::time_point now, bool driver_held) {
    if (!deadline_ || now < *deadline_) return;
    if (!port_.has_sandbox(*this)) {
        deadline_.reset();
        return;
    }
    if (interrupted_ && driver_held) {
        deadline_ = now + kInterruptGrace;
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

// The session state machine of `sqbox serve` (src/session/session_state.h), driven through a fake
// port: the driver's lines go in as bytes, and what the session sends to its client and its
// driver, the signals and the sandbox's starts come out. No sandbox, no descriptors.
//
// The fake port takes the hello (the driver's token) and each request's sequence number out of
// what goes to the driver, and from_driver() puts them into the driver's messages, as the driver
// does; the tests of forged messages write the driver's lines with or without them.
#include "session/session_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "util/errors.h"

namespace sqbox {
namespace {

using Clock = Session::Clock;

class FakePort : public SessionPort {
  public:
    void answer(Session& /*session*/, const json& message) override { answers.push_back(message); }
    void send_to_driver(Session& /*session*/, const json& message) override {
        if (message.value("op", "") == "hello") {
            token = message.at("token").get<std::string>();
            ++hellos;
            return;
        }
        json request = message;
        if (request.contains("seq")) {
            seqs.push_back(request.at("seq").get<uint64_t>());
            request.erase("seq");
        }
        to_driver.push_back(request);
    }
    void signal_sandbox(Session& /*session*/, int signal) override { signals.push_back(signal); }
    bool has_sandbox(const Session& /*session*/) const override { return sandbox; }
    void start_sandbox(Session& session) override {
        ++starts;
        if (on_start) on_start(session);
    }
    void retire_sandbox(Session& /*session*/) override { ++retires; }

    // What was answered since the last call, as compact JSON (key order matters).
    std::vector<std::string> take_answers() {
        std::vector<std::string> lines;
        for (const auto& message : answers) lines.push_back(message.dump());
        answers.clear();
        return lines;
    }
    std::vector<std::string> take_to_driver() {
        std::vector<std::string> lines;
        for (const auto& message : to_driver) lines.push_back(message.dump());
        to_driver.clear();
        return lines;
    }

    std::vector<json> answers;
    std::vector<json> to_driver;  // without the hello, and without the requests' "seq"
    std::string token;            // from the last hello
    int hellos = 0;
    std::vector<uint64_t> seqs;  // of the requests sent to the driver
    std::vector<int> signals;
    int starts = 0;
    int retires = 0;
    bool sandbox = true;
    std::function<void(Session&)> on_start;
};

using Lines = std::vector<std::string>;

class SessionStateTest : public ::testing::Test {
  protected:
    // A session whose driver has said it is ready (the open is answered and forgotten).
    Session& ready_session(std::vector<std::string> tools = {},
                           uint64_t output_limit = Session::kDefaultExecOutputLimit) {
        session_.emplace("s1", port_, std::move(tools), output_limit);
        session_->open(1);
        from_driver(R"({"event": "ready", "python": "3.11.2"})");
        port_.answers.clear();
        return *session_;
    }

    // One message from the driver, as one line (its text may be wrapped in the source here),
    // with the driver's token and the current request's sequence number as the driver adds
    // them, unless it has its own.
    void from_driver(std::string message) {
        std::replace(message.begin(), message.end(), '\n', ' ');
        json parsed = json::parse(message, nullptr, false);
        if (parsed.is_object()) {
            if (!parsed.contains("token")) parsed["token"] = port_.token;
            if (!parsed.contains("seq") && !port_.seqs.empty()) parsed["seq"] = port_.seqs.back();
            message = parsed.dump();
        }
        raw_from_driver(message);
    }
    // A line exactly as given.
    void raw_from_driver(const std::string& line) { session_->driver_output(line + "\n"); }

    static json request(const std::string& text) { return json::parse(text); }

    FakePort port_;
    std::optional<Session> session_;
};

TEST_F(SessionStateTest, OpenIsAnsweredWhenTheDriverIsReady) {
    Session session("s1", port_, {}, Session::kDefaultExecOutputLimit);
    EXPECT_EQ(session.state(), Session::State::kStarting);
    session.open("open-1");
    EXPECT_EQ(port_.starts, 1);
    EXPECT_EQ(session.state(), Session::State::kStarting);
    EXPECT_TRUE(session.has_work());
    EXPECT_TRUE(port_.answers.empty());

    EXPECT_EQ(port_.hellos, 1);
    session.driver_output(R"({"event": "ready", "python": "3.11.2", "token": ")" + port_.token +
                          "\"}\n");
    EXPECT_EQ(session.state(), Session::State::kIdle);
    EXPECT_FALSE(session.has_work());
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":"open-1","ok":true,"session":"s1"})"});
    EXPECT_TRUE(port_.to_driver.empty());
}

TEST_F(SessionStateTest, LinesMayArriveInPiecesAndSeveralAtOnce) {
    Session session("s1", port_, {}, Session::kDefaultExecOutputLimit);
    session.open(1);
    session.driver_output(R"({"event": "re)");
    EXPECT_EQ(session.state(), Session::State::kStarting);
    session.driver_output(R"(ady", "token": ")" + port_.token + "\"}");
    EXPECT_EQ(session.state(), Session::State::kStarting);
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "1"})"));
    session.driver_output("\n");
    const std::string result = R"({"event": "result", "seq": )" + std::to_string(port_.seqs.at(0)) +
                               R"(, "value": "1", "token": ")" + port_.token + "\"}\n";
    session.driver_output(result + result.substr(0, 9));  // and the start of a stale one
    EXPECT_EQ(session.state(), Session::State::kIdle);
    EXPECT_EQ(port_.take_answers(), (Lines{R"({"id":1,"ok":true,"session":"s1"})",
                                           R"({"value":"1","id":2,"ok":true,"timed_out":false})"}));
}

TEST_F(SessionStateTest, ToolsGivenAtOpenReachTheDriverFirstAndAreNotAnswered) {
    Session& session = ready_session({"search"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"tools","names":["search"]})"});
    EXPECT_EQ(session.state(), Session::State::kBusy);
    from_driver(R"({"event": "result", "ok": true})");
    EXPECT_EQ(session.state(), Session::State::kIdle);
    EXPECT_TRUE(port_.answers.empty());
}

TEST_F(SessionStateTest, RequestsSentWhileStartingWaitForTheDriver) {
    Session session("s1", port_, {}, Session::kDefaultExecOutputLimit);
    session.open(1);
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "x = 1"})"));
    EXPECT_TRUE(port_.to_driver.empty());
    session.driver_output(R"({"event": "ready", "token": ")" + port_.token + "\"}\n");
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"exec","code":"x = 1","output_limit":1048576})"});
    EXPECT_EQ(session.state(), Session::State::kBusy);
}

TEST_F(SessionStateTest, RequestsQueuedWhileBusyAreServedInOrder) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.submit(request(R"({"id": 3, "op": "put", "session": "s1", "path": "/tmp/f",
                              "data_b64": "aGk="})"));
    session.submit(request(R"({"id": "four", "op": "get", "session": "s1", "path": "/tmp/f",
                              "limit": 10})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"a","output_limit":1048576})"});
    EXPECT_TRUE(session.has_work());

    from_driver(R"({"event": "result", "stdout": "out", "stderr": "", "value": null,
                    "error": null})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"stdout":"out","stderr":"","value":null,"error":null,"id":2,"ok":true,)"
                    R"("timed_out":false})"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"put","path":"/tmp/f","data_b64":"aGk="})"});

    from_driver(R"({"event": "result", "ok": true})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"ok":true,"id":3})"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"get","path":"/tmp/f","limit":10})"});

    // A failed request keeps its "ok": false; only an exec's answer says whether it timed out.
    from_driver(R"({"event": "result", "ok": false, "error": {"type": "FileNotFoundError"}})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"ok":false,"error":{"type":"FileNotFoundError"},"id":"four"})"});
    EXPECT_EQ(session.state(), Session::State::kIdle);
    EXPECT_FALSE(session.has_work());
}

TEST_F(SessionStateTest, OutputLimitComesFromTheExecElseTheSession) {
    Session& session = ready_session({}, 4096);
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.submit(
        request(R"({"id": 3, "op": "exec", "session": "s1", "code": "b", "output_limit": 7})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"a","output_limit":4096})"});
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"b","output_limit":7})"});
}

TEST_F(SessionStateTest, AResultAnswersTheRequestBeingServed) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "b"})"));
    // An id in the driver's result does not choose the request it answers.
    from_driver(R"({"event": "result", "id": 3, "value": "'a'"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":2,"value":"'a'","ok":true,"timed_out":false})"});
    from_driver(R"({"event": "result", "value": "'b'"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"value":"'b'","id":3,"ok":true,"timed_out":false})"});
    EXPECT_EQ(session.state(), Session::State::kIdle);
}

TEST_F(SessionStateTest, MalformedRequestsAreAnsweredBadRequestAndTheNextIsServed) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1"})"));  // no code
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["id"], 2);
    EXPECT_EQ(port_.answers[0]["ok"], false);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "BadRequest");
    port_.answers.clear();
    EXPECT_EQ(session.state(), Session::State::kIdle);

    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "a",
                              "timeout": -1})"));
    session.submit(request(R"({"id": 4, "op": "exec", "session": "s1", "code": "b"})"));
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":3,"ok":false,"error":{"type":"BadRequest","message":"timeout: )"
                    R"j(expected a positive number of seconds (at most 604800)"}})j"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"b","output_limit":1048576})"});
    EXPECT_FALSE(session.deadline());
}

TEST_F(SessionStateTest, ATimeoutInterruptsTheCodeAndTheSessionLivesOn) {
    Session& session = ready_session();
    const auto before = Clock::now();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "while True: pass",
                              "timeout": 5})"));
    ASSERT_TRUE(session.deadline());
    const auto deadline = *session.deadline();
    EXPECT_GE(deadline, before + std::chrono::seconds(5));
    EXPECT_LE(deadline, Clock::now() + std::chrono::seconds(5));

    session.check_deadline(deadline - std::chrono::milliseconds(1));
    EXPECT_TRUE(port_.signals.empty());
    session.check_deadline(deadline);
    EXPECT_EQ(port_.signals, std::vector<int>{SIGINT});
    EXPECT_EQ(session.deadline(), deadline + Session::kInterruptGrace);

    from_driver(R"({"event": "result", "error": {"type": "KeyboardInterrupt"}})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"error":{"type":"KeyboardInterrupt"},"id":2,"ok":true,)"
                    R"("timed_out":true})"});
    EXPECT_FALSE(session.deadline());
    EXPECT_EQ(session.state(), Session::State::kIdle);

    // The next exec starts with a clean slate.
    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "1"})"));
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":3,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, CodeThatIgnoresTheInterruptHasItsSandboxKilled) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "while True: pass",
                              "timeout": 0.5})"));
    session.submit(request(R"({"id": 3, "op": "put", "session": "s1", "path": "/p",
                              "data_b64": ""})"));
    const auto deadline = *session.deadline();
    session.check_deadline(deadline);
    session.check_deadline(deadline + Session::kInterruptGrace);
    EXPECT_EQ(port_.signals, (std::vector<int>{SIGINT, SIGKILL}));
    EXPECT_FALSE(session.deadline());
    EXPECT_TRUE(port_.answers.empty());  // answered when the sandbox has ended

    session.sandbox_ended("");
    const std::string dead =
        R"("ok":false,"session_dead":true,"error":{"type":"SessionDead","message":"session s1 )"
        R"(is dead: the code did not stop after an interrupt; the session was killed"})";
    EXPECT_EQ(port_.take_answers(),
              (Lines{R"({"id":2,)" + dead + R"(,"timed_out":true})", R"({"id":3,)" + dead + "}"}));
    EXPECT_EQ(session.state(), Session::State::kDead);
    EXPECT_FALSE(session.has_work());
}

TEST_F(SessionStateTest, TheGraceAfterAnInterruptWaitsWhileTheDriverIsHeld) {
    // The server reads nothing of a driver whose client is behind with streamed output: the
    // interrupted code's answer cannot come, and the session is not killed for it.
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a",
                              "timeout": 1, "stream": true})"));
    const auto deadline = *session.deadline();
    session.check_deadline(deadline, true);  // the interrupt still comes on time
    EXPECT_EQ(port_.signals, std::vector<int>{SIGINT});
    session.check_deadline(deadline + Session::kInterruptGrace, true);
    EXPECT_EQ(port_.signals, std::vector<int>{SIGINT});
    EXPECT_EQ(*session.deadline(), deadline + 2 * Session::kInterruptGrace);
    session.check_deadline(deadline + 2 * Session::kInterruptGrace, false);
    EXPECT_EQ(port_.signals, (std::vector<int>{SIGINT, SIGKILL}));
}

TEST_F(SessionStateTest, OutputAfterAnInterruptGivesTheDriverMoreTime) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a",
                              "timeout": 0.001, "stream": true})"));
    const auto deadline = *session.deadline();
    session.check_deadline(deadline);
    EXPECT_EQ(port_.signals, std::vector<int>{SIGINT});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    from_driver(R"({"event": "output", "stream": "stdout", "data": "still coming"})");
    EXPECT_GT(*session.deadline(), deadline + Session::kInterruptGrace);
    // Output of a request not interrupted leaves its deadline alone.
    from_driver(R"({"event": "result"})");
    EXPECT_FALSE(session.deadline());
}

TEST_F(SessionStateTest, ADeadlineWithoutASandboxIsDropped) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a",
                              "timeout": 1})"));
    port_.sandbox = false;
    session.check_deadline(*session.deadline());
    EXPECT_FALSE(session.deadline());
    EXPECT_TRUE(port_.signals.empty());
}

TEST_F(SessionStateTest, AToolCallIsForwardedAndItsAnswerGoesBack) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");  // the internal tools request
    port_.to_driver.clear();
    session.submit(request(
        R"({"id": 5, "op": "exec", "session": "s1", "code": "found = tools.search(1) or 0"})"));
    port_.to_driver.clear();

    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search", "args": ["q"],
                    "kwargs": {"k": 3, "a": 1}})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":5,"event":"tool_call","session":"s1","call_id":"c1",)"
                    R"("name":"search","args":["q"],"kwargs":{"k":3,"a":1}})"});
    session.tool_result(request(R"({"op": "tool_result", "session": "s1", "call_id": "c1",
                                   "result": {"z": 1, "b": 2}})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":"c1","result":{"z":1,"b":2}})"});

    // A second call once the first is answered; without args and kwargs, and answered with an
    // error.
    from_driver(R"({"event": "tool_call", "call_id": 2, "name": "search"})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":5,"event":"tool_call","session":"s1","call_id":2,)"
                    R"("name":"search","args":[],"kwargs":{}})"});
    session.tool_result(request(R"({"op": "tool_result", "session": "s1", "call_id": 2,
                                   "error": {"type": "ValueError", "message": "bad"}})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":2,"error":{"type":"ValueError",)"
                    R"("message":"bad"}})"});

    from_driver(R"({"event": "result", "value": "['a']"})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"value":"['a']","id":5,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, ToolResultsNobodyAwaitsAreDropped) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    port_.to_driver.clear();
    const json answer = request(R"({"op": "tool_result", "session": "s1", "call_id": "c1",
                                    "result": 1})");
    session.tool_result(answer);  // idle
    session.submit(request(R"({"id": 5, "op": "exec", "session": "s1", "code": "a"})"));
    port_.to_driver.clear();
    session.tool_result(answer);  // busy, but no call asked
    EXPECT_TRUE(port_.to_driver.empty());

    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    // An answer to another call (a late one to an earlier exec's) is not this call's.
    session.tool_result(request(R"({"op": "tool_result", "session": "s1", "call_id": "c0",
                                   "result": 0})"));
    EXPECT_TRUE(port_.to_driver.empty());
    session.tool_result(answer);
    session.tool_result(answer);  // answered already
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"tool_result","call_id":"c1","result":1})"});
}

TEST_F(SessionStateTest, AToolResultWithoutCallIdFailsTheAwaitedCall) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 5, "op": "exec", "session": "s1", "code": "a"})"));
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    port_.to_driver.clear();
    port_.answers.clear();
    for (const char* malformed : {R"({"op": "tool_result", "session": "s1", "result": 1})",
                                  R"({"op": "tool_result", "session": "s1", "call_id": [1]})"}) {
        EXPECT_THROW(session.tool_result(request(malformed)), Error) << malformed;
    }
    // The driver is not left waiting: its call fails (once), and the code goes on.
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":"c1","error":{"type":"BadToolResult",)"
                    R"("message":"the client's answer to this call was malformed"}})"});
    session.tool_result(request(R"({"op": "tool_result", "call_id": "c1", "result": 1})"));
    EXPECT_TRUE(port_.to_driver.empty());
    from_driver(R"({"event": "result", "value": "2"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"value":"2","id":5,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, ACallOfAToolNotRegisteredIsRefusedToTheDriver) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 5, "op": "exec", "session": "s1", "code": "a"})"));
    port_.to_driver.clear();
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "rm_rf"})");
    from_driver(R"({"event": "tool_call", "call_id": "c2", "name": ["search"]})");
    const std::string refused = R"(,"error":{"type":"NameError","message":"no such tool"}})";
    EXPECT_EQ(port_.take_to_driver(), (Lines{R"({"op":"tool_result","call_id":"c1")" + refused,
                                             R"({"op":"tool_result","call_id":"c2")" + refused}));
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_EQ(session.state(), Session::State::kBusy);
}

TEST_F(SessionStateTest, TheToolsRequestReplacesTheNames) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    port_.to_driver.clear();
    session.submit(request(R"({"id": 2, "op": "tools", "session": "s1", "names": ["lookup"]})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"tools","names":["lookup"]})"});
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":2,"ok":true})"});
    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "a"})"));
    port_.to_driver.clear();
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":"c1","error":{"type":"NameError",)"
                    R"("message":"no such tool"}})"});
}

// The code in the session can write on the driver's channel; what it could forge is handled as
// below.
TEST_F(SessionStateTest, LinesThatAreNotDriverMessagesAreIgnored) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    port_.to_driver.clear();
    from_driver("");
    from_driver("not json");
    from_driver("[1, 2]");
    from_driver(R"({"event": 5})");
    from_driver(R"({"event": "unknown"})");
    from_driver(R"({"no_event": true})");
    from_driver(std::string(70, '[') + std::string(70, ']'));                     // too deep
    from_driver(R"({"event": "tool_call", "name": "search"})");                   // no call_id
    from_driver(R"({"event": "tool_call", "call_id": 1.5, "name": "search"})");   // not an id
    from_driver(R"({"event": "tool_call", "call_id": null, "name": "search"})");  // not an id
    from_driver(R"({"event": "result", "seq": "2"})");                            // not a number
    from_driver(R"({"event": "result", "seq": -2})");
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_TRUE(port_.to_driver.empty());
    EXPECT_TRUE(port_.signals.empty());
    EXPECT_EQ(session.state(), Session::State::kBusy);
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":2,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, EachRequestHasANewNumberAndEachSandboxANewToken) {
    Session& session = ready_session({"search"});
    EXPECT_EQ(port_.hellos, 1);
    const std::string first_token = port_.token;
    EXPECT_EQ(first_token.size(), 32U);
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 3, "op": "get", "session": "s1", "path": "/p"})"));
    // Random, so that code that knows its own request's number cannot tell the next one's.
    ASSERT_EQ(port_.seqs.size(), 3U);
    EXPECT_NE(port_.seqs[0], port_.seqs[1]);
    EXPECT_NE(port_.seqs[1], port_.seqs[2]);
    for (const uint64_t seq : port_.seqs) {
        EXPECT_NE(seq, 0U);
        EXPECT_LT(seq, uint64_t{1} << 63);
    }
    session.reset(4);
    EXPECT_EQ(port_.hellos, 2);
    EXPECT_NE(port_.token, first_token);
    // The old driver's token means nothing to the new sandbox.
    raw_from_driver(R"({"event": "ready", "token": ")" + first_token + "\"}");
    EXPECT_EQ(session.state(), Session::State::kStarting);
    from_driver(R"({"event": "ready"})");
    EXPECT_EQ(session.state(), Session::State::kBusy);  // the tools request
    EXPECT_EQ(port_.seqs.size(), 4U);
}

TEST_F(SessionStateTest, LinesWithoutTheTokenAreIgnored) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    port_.answers.clear();
    port_.to_driver.clear();
    const std::string seq = std::to_string(port_.seqs.back());
    std::string wrong = port_.token;
    wrong.back() = wrong.back() == '0' ? '1' : '0';
    const std::vector<std::string> tokens = {"", R"(,"token":null)", R"(,"token":"")",
                                             R"(,"token":")" + wrong + "\"",
                                             R"(,"token":")" + port_.token + "0\""};
    for (const std::string& token : tokens) {
        raw_from_driver(R"({"event":"result","seq":)" + seq + token + "}");
        raw_from_driver(R"({"event":"tool_call","call_id":"x","name":"search","seq":)" + seq +
                        token + "}");
        raw_from_driver(R"({"event":"ready")" + token + "}");
    }
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_TRUE(port_.to_driver.empty());
    EXPECT_TRUE(port_.signals.empty());
    EXPECT_EQ(session.state(), Session::State::kBusy);
    from_driver(R"({"event": "result", "value": "'a'"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"value":"'a'","id":2,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, MessagesOutOfTurnAreIgnored) {
    Session& session = ready_session({"search"});
    // During the internal tools request, tool calls do not reach the client.
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_TRUE(port_.take_to_driver().size() == 1);  // the tools request itself
    from_driver(R"({"event": "result"})");
    // Idle: no result is expected, and a tool call is refused to the driver (code that goes on
    // after its request was answered must not wait for ever).
    from_driver(R"({"event": "result", "value": "1"})");
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":"c1","error":{"type":"RequestAnswered",)"
                    R"("message":"the request this code runs for was answered"}})"});
    EXPECT_EQ(session.state(), Session::State::kIdle);
}

TEST_F(SessionStateTest, AReadyAfterTheStartIsIgnored) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "b"})"));
    port_.to_driver.clear();
    from_driver(R"({"event": "ready"})");  // with the token: the code read it from the driver
    EXPECT_TRUE(port_.to_driver.empty());
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_EQ(session.state(), Session::State::kBusy);
    // The request being served gets its own result, and the next one goes to the driver.
    from_driver(R"({"event": "result", "value": "'a'"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"value":"'a'","id":2,"ok":true,"timed_out":false})"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"b","output_limit":1048576})"});
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":3,"ok":true,"timed_out":false})"});
}

TEST_F(SessionStateTest, AForgedResultWithTheTokenSpoilsOnlyTheRequestItCameIn) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"j({"id": 2, "op": "exec", "session": "s1", "code": "forge()"})j"));
    session.submit(request(R"j({"id": 3, "op": "exec", "session": "s1", "code": "check()"})j"));
    port_.to_driver.clear();
    const uint64_t forged_seq = port_.seqs.back();
    // The code forges its own request's result, and then guesses at the next request's number.
    from_driver(R"({"event": "result", "value": "'forged'"})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"value":"'forged'","id":2,"ok":true,"timed_out":false})"});
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"j({"op":"exec","code":"check()","output_limit":1048576})j"});
    const uint64_t next_seq = port_.seqs.back();
    for (const uint64_t guess : {forged_seq + 1, forged_seq - 1, uint64_t{0}, uint64_t{1}}) {
        if (guess == next_seq) continue;  // one chance in 2^63 that a guess is right
        from_driver(R"({"event": "result", "seq": )" + std::to_string(guess) +
                    R"(, "value": "'forged for 3'"})");
    }
    EXPECT_TRUE(port_.answers.empty());
    // The code goes on: its tool calls are refused to the driver, its real result is dropped.
    from_driver(R"({"event": "tool_call", "seq": )" + std::to_string(forged_seq) +
                R"(, "call_id": "c1", "name": "search"})");
    from_driver(R"({"event": "result", "seq": )" + std::to_string(forged_seq) +
                R"(, "value": "'real 2'"})");
    EXPECT_TRUE(port_.answers.empty());
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"tool_result","call_id":"c1","error":{"type":"RequestAnswered",)"
                    R"("message":"the request this code runs for was answered"}})"});
    // The next request gets its own answer.
    from_driver(R"({"event": "result", "value": "'real 3'"})");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"value":"'real 3'","id":3,"ok":true,"timed_out":false})"});
    EXPECT_TRUE(port_.signals.empty());
}

TEST_F(SessionStateTest, OverlappingToolCallsKillTheSandbox) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 5, "op": "exec", "session": "s1", "code": "a"})"));
    from_driver(R"({"event": "tool_call", "call_id": "c1", "name": "search"})");
    port_.answers.clear();
    from_driver(R"({"event": "tool_call", "call_id": "c2", "name": "search"})");
    EXPECT_EQ(port_.signals, std::vector<int>{SIGKILL});
    EXPECT_TRUE(port_.answers.empty());
    session.driver_gone();
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":5,"ok":false,"session_dead":true,"error":{"type":"SessionDead",)"
                    R"("message":"session s1 is dead: the session broke the protocol )"
                    R"j((overlapping tool calls)"},"timed_out":false})j"});
}

TEST_F(SessionStateTest, AnOversizedDriverLineKillsTheSandbox) {
    Session& session = ready_session();
    session.driver_output(std::string(kMaxRequestBytes, 'x'));
    EXPECT_TRUE(port_.signals.empty());
    session.driver_output("x");
    EXPECT_EQ(port_.signals, std::vector<int>{SIGKILL});
    session.sandbox_ended("");
    session.submit(request(R"({"id": 2, "op": "get", "session": "s1", "path": "/p"})"));
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":2,"ok":false,"session_dead":true,"error":{"type":"SessionDead",)"
                    R"("message":"session s1 is dead: the session driver sent an oversized )"
                    R"(message"}})"});
}

TEST_F(SessionStateTest, TheDriversEndAnswersEverythingPendingAsDead) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(
        request(R"({"id": 7, "op": "exec", "session": "s1", "code": "raise SystemExit"})"));
    session.submit(request(R"({"id": 8, "op": "put", "session": "s1", "path": "/p",
                              "data_b64": ""})"));
    port_.to_driver.clear();
    session.driver_log("Traceback (most recent call last):\n");
    session.driver_log("SystemExit\n\n");
    session.driver_gone();
    EXPECT_EQ(port_.signals, std::vector<int>{SIGKILL});
    EXPECT_EQ(session.state(), Session::State::kDead);
    const std::string dead =
        R"("ok":false,"session_dead":true,"error":{"type":"SessionDead","message":"session s1 )"
        R"(is dead: the interpreter exited; its last output: Traceback (most recent call )"
        R"(last):\nSystemExit"})";
    EXPECT_EQ(port_.take_answers(),
              (Lines{R"({"id":7,)" + dead + R"(,"timed_out":false})", R"({"id":8,)" + dead + "}"}));

    // Until reset, every request is answered the same at once; the sandbox's report changes
    // nothing.
    session.sandbox_ended("killed");
    session.submit(request(R"({"id": 9, "op": "exec", "session": "s1", "code": "1"})"));
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":9,)" + dead + "}"});
    EXPECT_TRUE(port_.to_driver.empty());
}

TEST_F(SessionStateTest, TheSandboxsErrorSaysWhyTheSessionDied) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.sandbox_ended("the memory limit was reached");
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":2,"ok":false,"session_dead":true,"error":{"type":"SessionDead",)"
                    R"("message":"session s1 is dead: the memory limit was reached"},)"
                    R"("timed_out":false})"});
}

TEST_F(SessionStateTest, ASessionThatCannotStartAnswersItsOpen) {
    // The port reports a failed launch at once, from inside start_sandbox.
    port_.on_start = [](Session& session) { session.sandbox_ended("cannot mount /data"); };
    Session session("s1", port_, {}, Session::kDefaultExecOutputLimit);
    session.open(1);
    EXPECT_EQ(session.state(), Session::State::kDead);
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":1,"ok":false,"error":{"type":"SessionError","message":"the )"
                    R"(session could not start: cannot mount /data"}})"});
}

TEST_F(SessionStateTest, ResetAnswersWhatIsPendingAndStartsAFreshSandbox) {
    Session& session = ready_session({"search"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a",
                              "timeout": 9})"));
    session.submit(request(R"({"id": 3, "op": "get", "session": "s1", "path": "/p"})"));
    port_.to_driver.clear();
    session.driver_output(R"({"event": "resu)");  // the old driver's unfinished line
    session.reset(4);
    const std::string reset = R"(,"ok":false,"error":{"type":"SessionReset","message":"the )"
                              R"(session was reset"}})";
    EXPECT_EQ(port_.take_answers(), (Lines{R"({"id":2)" + reset, R"({"id":3)" + reset}));
    EXPECT_EQ(port_.retires, 1);
    EXPECT_EQ(port_.starts, 2);
    EXPECT_EQ(session.state(), Session::State::kStarting);
    EXPECT_FALSE(session.deadline());

    // The old driver's output does not carry over; the new one is ready and gets the tools.
    from_driver(R"({"event": "ready"})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"id":4,"ok":true,"session":"s1"})"});
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"tools","names":["search"]})"});
}

TEST_F(SessionStateTest, ResetBringsADeadSessionBack) {
    Session& session = ready_session();
    session.driver_log("oops\n");
    session.driver_gone();
    session.reset(2);
    EXPECT_TRUE(port_.answers.empty());
    from_driver(R"({"event": "ready"})");
    session.submit(request(R"({"id": 3, "op": "exec", "session": "s1", "code": "1"})"));
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), (Lines{R"({"id":2,"ok":true,"session":"s1"})",
                                           R"({"id":3,"ok":true,"timed_out":false})"}));
    // A later death says nothing of the earlier one's output.
    session.driver_gone();
    session.submit(request(R"({"id": 4, "op": "exec", "session": "s1", "code": "1"})"));
    EXPECT_EQ(port_.answers.at(0)["error"]["message"],
              "session s1 is dead: the interpreter exited");
}

TEST_F(SessionStateTest, AResetWhileStartingAnswersTheOpenToo) {
    Session session("s1", port_, {}, Session::kDefaultExecOutputLimit);
    session.open(1);
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.reset(3);
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":2,"ok":false,"error":{"type":"SessionReset","message":"the )"
                    R"(session was reset"}})"});
    session.driver_output(R"({"event": "ready", "token": ")" + port_.token + "\"}\n");
    EXPECT_EQ(port_.take_answers(), (Lines{R"({"id":1,"ok":true,"session":"s1"})",
                                           R"({"id":3,"ok":true,"session":"s1"})"}));
}

TEST_F(SessionStateTest, CloseAnswersWhatIsPendingAndRetiresTheSandbox) {
    Session& session = ready_session({"search"});
    // The internal tools request is being served: it is not answered.
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    session.close();
    EXPECT_EQ(port_.take_answers(),
              Lines{R"({"id":2,"ok":false,"error":{"type":"SessionClosed","message":"the )"
                    R"(session was closed"}})"});
    EXPECT_EQ(port_.retires, 1);
}

// ---- streamed output and background processes ----

TEST_F(SessionStateTest, AStreamingExecsOutputEventsReachTheClientBeforeItsResult) {
    Session& session = ready_session();
    session.submit(
        request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a", "stream": true})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"exec","code":"a","output_limit":1048576,"stream":true})"});
    from_driver(R"({"event": "output", "stream": "stdout", "data": "one\n"})");
    from_driver(R"({"event": "output", "stream": "stderr", "data": "two\n"})");
    from_driver(R"({"event": "result", "stdout": "one\n"})");
    EXPECT_EQ(port_.take_answers(),
              (Lines{R"({"id":2,"event":"output","stream":"stdout","data":"one\n","session":"s1"})",
                     R"({"id":2,"event":"output","stream":"stderr","data":"two\n","session":"s1"})",
                     R"({"stdout":"one\n","id":2,"ok":true,"timed_out":false})"}));
}

TEST_F(SessionStateTest, OutputEventsNotOfAStreamingExecAreDropped) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a"})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"exec","code":"a","output_limit":1048576})"});
    from_driver(R"({"event": "output", "stream": "stdout", "data": "not asked for"})");
    from_driver(R"({"event": "result"})");
    session.submit(
        request(R"({"id": 3, "op": "exec", "session": "s1", "code": "b", "stream": true})"));
    // Without the token, with another request's number, malformed: dropped.
    from_driver(R"({"event": "output", "token": "0", "stream": "stdout", "data": "forged"})");
    from_driver(R"({"event": "output", "seq": 1, "stream": "stdout", "data": "stale"})");
    from_driver(R"({"event": "output", "stream": "stdin", "data": "bad stream"})");
    from_driver(R"({"event": "output", "stream": "stdout", "data": 5})");
    from_driver(R"({"event": "result"})");
    EXPECT_EQ(port_.take_answers(), (Lines{R"({"id":2,"ok":true,"timed_out":false})",
                                           R"({"id":3,"ok":true,"timed_out":false})"}));
}

TEST_F(SessionStateTest, AStreamThatIsNotABooleanIsABadRequest) {
    Session& session = ready_session();
    session.submit(
        request(R"({"id": 2, "op": "exec", "session": "s1", "code": "a", "stream": "yes"})"));
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "BadRequest");
    EXPECT_TRUE(port_.to_driver.empty());
}

TEST_F(SessionStateTest, ProcessRequestsReachTheDriverCheckedAndInOrder) {
    Session& session = ready_session();
    session.submit(request(R"({"id": 2, "op": "process_start", "session": "s1",
                              "command": ["sleep", "9"], "env": {"A": "b"}, "workdir": "/tmp",
                              "stray": 1})"));
    session.submit(request(R"({"id": 3, "op": "process_read", "session": "s1",
                              "process": "p1", "limit": 10})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"process_start","command":["sleep","9"],"env":{"A":"b"},)"
                    R"("workdir":"/tmp"})"});
    from_driver(R"({"event": "result", "process": "p1"})");
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"process_read","process":"p1","limit":10})"});
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 4, "op": "process_wait", "session": "s1", "process": "p1",
                              "timeout": 1.5})"));
    from_driver(R"({"event": "result"})");
    session.submit(request(R"({"id": 5, "op": "process_kill", "session": "s1", "process": "p1",
                              "signal": 15})"));
    EXPECT_EQ(port_.take_to_driver(),
              (Lines{R"({"op":"process_wait","process":"p1","timeout":1.5})",
                     R"({"op":"process_kill","process":"p1","signal":15})"}));
}

TEST_F(SessionStateTest, MalformedProcessRequestsAreAnsweredBadRequest) {
    Session& session = ready_session();
    for (const char* text : {
             R"({"id": 2, "op": "process_start", "session": "s1", "command": []})",
             R"({"id": 2, "op": "process_start", "session": "s1", "command": "sleep 9"})",
             R"({"id": 2, "op": "process_start", "session": "s1", "command": ["a"], "env": 1})",
             R"({"id": 2, "op": "process_read", "session": "s1"})",
             R"({"id": 2, "op": "process_read", "session": "s1", "process": "p1", "limit": -1})",
             R"({"id": 2, "op": "process_wait", "session": "s1", "process": "p1", "timeout": -1})",
             R"({"id": 2, "op": "process_kill", "session": "s1", "process": "p1", "signal": 0})",
             R"({"id": 2, "op": "process_kill", "session": "s1", "process": "p1", "signal": 99})",
         }) {
        session.submit(request(text));
        ASSERT_EQ(port_.answers.size(), 1U) << text;
        EXPECT_EQ(port_.answers[0]["error"]["type"], "BadRequest") << text;
        port_.answers.clear();
    }
    EXPECT_TRUE(port_.to_driver.empty());
}

// ---- directory transfers and shells (session_extras.h) ----

TEST_F(SessionStateTest, AnUploadChunkPastTheBudgetIsRefusedBeforeTheDriverSeesIt) {
    Session& session = ready_session();
    session.set_transfer_budget(10);
    // 12 characters of base64: 9 bytes, within the budget at offset 0, not at offset 4.
    session.submit(request(R"({"id": 2, "op": "upload", "session": "s1", "path": "/w",
                              "data_b64": "AAAAAAAAAAAA"})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"upload","offset":0,"path":"/w","data_b64":"AAAAAAAAAAAA",)"
                    R"("last":false})"});
    from_driver(R"({"event": "result", "ok": true})");
    port_.answers.clear();
    session.submit(request(R"({"id": 3, "op": "upload", "session": "s1", "offset": 4,
                              "data_b64": "AAAAAAAAAAAA", "last": true})"));
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["id"], 3);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "TooLarge");
    EXPECT_TRUE(port_.to_driver.empty());
    EXPECT_EQ(session.state(), Session::State::kIdle);
}

TEST_F(SessionStateTest, ADownloadChunkPastTheBudgetIsNotPassedOn) {
    Session& session = ready_session();
    session.set_transfer_budget(10);
    session.submit(request(R"({"id": 2, "op": "download", "session": "s1", "path": "/w"})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"download","offset":0,"path":"/w","limit":10})"});
    from_driver(R"({"event": "result", "ok": true, "data_b64": "AAAA", "last": false})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"ok":true,"data_b64":"AAAA","last":false,"id":2})"});
    // The driver (the session's code) goes on past the budget: the stream ends there.
    session.submit(request(R"({"id": 3, "op": "download", "session": "s1", "offset": 3})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"download","offset":3,"limit":10})"});
    from_driver(R"({"event": "result", "ok": true, "data_b64": "AAAAAAAAAAAA", "last": true})");
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["id"], 3);
    EXPECT_EQ(port_.answers[0]["ok"], false);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "TooLarge");
    EXPECT_FALSE(port_.answers[0].contains("data_b64"));
    port_.answers.clear();
    // A download answer without data is not taken for a chunk either.
    session.submit(request(R"({"id": 4, "op": "download", "session": "s1", "path": "/w"})"));
    from_driver(R"({"event": "result", "ok": true, "last": true})");
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "TooLarge");
    port_.answers.clear();
    port_.to_driver.clear();
    session.submit(request(R"({"id": 5, "op": "download", "session": "s1", "offset": 11})"));
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "TooLarge");
    EXPECT_TRUE(port_.to_driver.empty());
}

TEST_F(SessionStateTest, AShellCommandGoesToTheDriverWithTheSessionsOutputLimit) {
    Session& session = ready_session({}, 77);
    session.submit(request(R"({"id": 2, "op": "shell", "session": "s1", "command": "cd /tmp",
                              "name": "b"})"));
    EXPECT_EQ(port_.take_to_driver(),
              Lines{R"({"op":"shell","name":"b","command":"cd /tmp","output_limit":77})"});
    EXPECT_FALSE(session.deadline());
    from_driver(R"({"event": "result", "ok": true, "exit_code": 0})");
    EXPECT_EQ(port_.take_answers(), Lines{R"({"ok":true,"exit_code":0,"id":2})"});

    session.submit(request(R"({"id": 3, "op": "shell_close", "session": "s1", "name": "b"})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"shell_close","name":"b"})"});
    from_driver(R"({"event": "result", "ok": true, "closed": true})");
    port_.answers.clear();

    session.submit(request(R"({"id": 4, "op": "shell", "session": "s1"})"));  // no command
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "BadRequest");
}

TEST_F(SessionStateTest, AShellCommandsTimeoutIsTheDriversWithTheServerAsBackstop) {
    Session& session = ready_session();
    const auto before = Clock::now();
    session.submit(request(R"({"id": 2, "op": "shell", "session": "s1", "command": "sleep 9",
                              "timeout": 1, "output_limit": 5})"));
    EXPECT_EQ(port_.take_to_driver(), Lines{R"({"op":"shell","command":"sleep 9",)"
                                            R"("output_limit":5,"timeout":1.0})"});
    ASSERT_TRUE(session.deadline());
    EXPECT_GE(*session.deadline(), before + std::chrono::seconds(6));
    // A driver that does not answer is interrupted, then its sandbox killed, as for exec.
    session.check_deadline(*session.deadline());
    session.check_deadline(*session.deadline());
    EXPECT_EQ(port_.signals, (std::vector<int>{SIGINT, SIGKILL}));

    session_.reset();
    Session& next = ready_session();
    next.submit(request(R"({"id": 3, "op": "shell", "session": "s1", "command": "x",
                            "timeout": 0})"));
    ASSERT_EQ(port_.answers.size(), 1U);
    EXPECT_EQ(port_.answers[0]["error"]["type"], "BadRequest");
    EXPECT_FALSE(next.deadline());
}

}  // namespace
}  // namespace sqbox

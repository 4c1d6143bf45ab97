#include "session/process_requests.h"

#include <array>
#include <csignal>
#include <map>
#include <vector>

#include "util/errors.h"

namespace sqbox {
namespace {

constexpr std::array<const char*, 4> kProcessOps = {"process_start", "process_read", "process_wait",
                                                    "process_kill"};

// A week, as for an exec's timeout.
constexpr double kMaxWaitSeconds = 7 * 24 * 3600;

}  // namespace

bool is_process_op(const std::string& op) {
    for (const char* name : kProcessOps) {
        if (op == name) return true;
    }
    return false;
}

json process_request_for_driver(const json& request) {
    const std::string op = request.at("op").get<std::string>();
    json message = {{"op", op}};
    if (op == "process_start") {
        const auto command = request.at("command").get<std::vector<std::string>>();
        if (command.empty()) throw Error("command: expected a non-empty list of strings");
        message["command"] = command;
        if (request.contains("env")) {
            message["env"] = request.at("env").get<std::map<std::string, std::string>>();
        }
        if (request.contains("workdir")) {
            message["workdir"] = request.at("workdir").get<std::string>();
        }
        return message;
    }
    message["process"] = request.at("process").get<std::string>();
    if (op == "process_read" && request.contains("limit")) {
        // get<uint64_t> would take -1 for 2^64-1.
        if (!request.at("limit").is_number_unsigned()) throw Error("limit: expected a byte count");
        message["limit"] = request.at("limit").get<uint64_t>();
    } else if (op == "process_wait" && request.contains("timeout")) {
        const double timeout = request.at("timeout").get<double>();
        if (!(timeout >= 0) || timeout > kMaxWaitSeconds) {
            throw Error("timeout: expected a number of seconds from 0 to a week");
        }
        message["timeout"] = timeout;
    } else if (op == "process_kill" && request.contains("signal")) {
        const int signal = request.at("signal").get<int>();
        if (signal < 1 || signal >= NSIG) throw Error("signal: expected a signal number");
        message["signal"] = signal;
    }
    return message;
}

}  // namespace sqbox

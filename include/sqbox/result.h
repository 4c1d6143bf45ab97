// What a finished sandbox run reports back to its caller.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace sqbox {

struct RunResult {
    int exit_status = 0;                   // what the sqbox process exits with (see README.md)
    std::optional<int> payload_exit_code;  // set when the payload exited normally
    std::optional<int> signal;             // set when the payload was killed by a signal
    bool timed_out = false;
    bool payload_started = false;
    double wall_ms = 0;           // wall-clock time of the payload
    double cpu_ms = 0;            // user + system CPU time of the payload and its reaped children
    uint64_t peak_rss_bytes = 0;  // largest resident set of the payload or any reaped descendant
    std::string error;            // sqbox's own failure, empty when none
};

}  // namespace sqbox

// The one message each stage of the pipeline sends to its parent when it is done: init tells the
// supervisor how the payload ended, the supervisor tells the launcher. Fixed-size POD, written
// with a single write(2) (smaller than PIPE_BUF, so atomic) and read whole.
#pragma once

#include <cstdint>
#include <string>

#include "util/errors.h"

namespace sqbox {

struct StageReport {
    static constexpr uint32_t kMagic = 0x73716278;  // "sqbx"
    uint32_t magic = kMagic;
    int32_t exit_status = 0;  // what sqbox exits with, as far as this stage knows
    uint8_t payload_started = 0;
    uint8_t payload_finished = 0;
    uint8_t timed_out = 0;
    // The stage failed because the image's FUSE connection is gone: the image server died, and
    // the supervisor, not this stage, tells the user (in one line, with the cause).
    uint8_t image_server_lost = 0;
    int32_t wait_status = 0;  // raw wait status of the payload when payload_finished
    int64_t wall_ns = 0;
    int64_t cpu_ns = 0;
    int64_t max_rss_kib = 0;
    char error[1024] = {};  // sqbox's own failure message (already printed), or empty

    void set_error(const std::string& message);
    // Init's early word that the payload runs (not how it ended).
    [[nodiscard]] bool only_started() const {
        return payload_started != 0 && payload_finished == 0 && exit_status == 0 &&
               error[0] == '\0';
    }
    [[nodiscard]] std::string error_message() const;
};

// Sends `report` on `fd`; failures are ignored (the reader treats a missing report as a crash).
void send_report(int fd, const StageReport& report);
// Reads a complete report; returns false if the writer died without sending one.
bool receive_report(int fd, StageReport& report);
// Reads reports until EOF and keeps the last: init sends an early one when the payload has
// started, so a sandbox killed later (timeout) still tells that it ran.
bool receive_last_report(int fd, StageReport& report);

// How every stage fails: prints "sqbox: <message>", reports `exit_status` and the message on `fd`,
// and exits with `exit_status`.
[[noreturn]] void fail_stage(int fd, int exit_status, const std::string& message);

// True for the errors of an operation on a FUSE mount whose server has died (the connection was
// aborted): ECONNABORTED, ENOTCONN.
bool is_lost_image_server(int system_errno);

// fail_stage for `error`; if it is that of a lost image server, prints nothing and sets
// image_server_lost: the supervisor's line about the server says it all.
[[noreturn]] void fail_stage(int fd, int exit_status, const Error& error);

}  // namespace sqbox

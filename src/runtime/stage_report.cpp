#include "runtime/stage_report.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

void StageReport::set_error(const std::string& message) {
    size_t n = std::min(message.size(), sizeof error - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
}

std::string StageReport::error_message() const {
    return std::string(error, strnlen(error, sizeof error));
}

void send_report(int fd, const StageReport& report) {
    (void)write_all(fd, &report, sizeof report);
}

void fail_stage(int fd, int exit_status, const std::string& message) {
    print_error(message);
    StageReport report;
    report.exit_status = exit_status;
    report.set_error(message);
    send_report(fd, report);
    ::_exit(exit_status);
}

bool is_lost_image_server(int system_errno) {
    return system_errno == ECONNABORTED || system_errno == ENOTCONN;
}

void fail_stage(int fd, int exit_status, const Error& error) {
    if (!is_lost_image_server(error.system_errno())) fail_stage(fd, exit_status, error.what());
    StageReport report;
    report.exit_status = exit_status;
    report.image_server_lost = 1;
    report.set_error(error.what());
    send_report(fd, report);
    ::_exit(exit_status);
}

bool receive_report(int fd, StageReport& report) {
    StageReport incoming;
    if (read_full(fd, &incoming, sizeof incoming) != static_cast<ssize_t>(sizeof incoming)) {
        return false;
    }
    if (incoming.magic != StageReport::kMagic) return false;
    report = incoming;
    report.error[sizeof report.error - 1] = '\0';
    return true;
}

bool receive_last_report(int fd, StageReport& report) {
    bool received = false;
    StageReport incoming;
    while (receive_report(fd, incoming)) {
        report = incoming;
        received = true;
    }
    return received;
}

}  // namespace sqbox

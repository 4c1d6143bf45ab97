#include "util/errors.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sqbox {

Error system_error(const std::string& what, int err) {
    return Error(what + ": " + std::strerror(err), err);
}

Error system_error(const std::string& what) {
    return system_error(what, errno);
}

namespace {
int diagnostics_fd = -1;
}  // namespace

void set_diagnostics_fd(int fd) {
    diagnostics_fd = fd;
}

void print_error(const std::string& message) {
    std::string line = "sqbox: " + message + "\n";
    // Best effort: if stderr is gone there is nobody left to tell.
    (void)!::write(diagnostics_fd >= 0 ? diagnostics_fd : STDERR_FILENO, line.data(), line.size());
}

}  // namespace sqbox

#include "util/errors.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "util/text.h"

namespace sqbox {

Error system_error(const std::string& what, int err) {
    return Error(what + ": " + std::strerror(err), err);
}

Error system_error(const std::string& what) {
    return system_error(what, errno);
}

namespace {
UniqueFd diagnostics;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables): per process
}  // namespace

void adopt_diagnostics_fd(UniqueFd fd) {
    diagnostics = std::move(fd);
}

int diagnostics_fd() {
    return diagnostics.get();
}

void print_error(const std::string& message) {
    // One line, whatever names the message quotes.
    std::string line = "sqbox: " + blank_controls(message) + "\n";
    // Best effort: if stderr is gone there is nobody left to tell.
    (void)!::write(diagnostics ? diagnostics.get() : STDERR_FILENO, line.data(), line.size());
}

}  // namespace sqbox

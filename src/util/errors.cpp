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

void print_error(const std::string& message) {
    std::string line = "sqbox: " + message + "\n";
    // Best effort: if stderr is gone there is nobody left to tell.
    (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace sqbox

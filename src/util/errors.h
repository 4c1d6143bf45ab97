// Error reporting: every failure carries the context of what was being done, and sqbox's own
// failures map to one documented exit status.
#pragma once

#include <stdexcept>
#include <string>

#include "util/unique_fd.h"

namespace sqbox {

// Exit statuses of the sqbox binary besides the payload's own (documented in docs/run.md).
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitSqboxFailure = 125;
inline constexpr int kExitNotExecutable = 126;
inline constexpr int kExitNotFound = 127;
inline constexpr int kExitSignalBase = 128;

// A failure of sqbox itself, with a one-line message for the user and, when a system call failed,
// its errno (0 otherwise) so callers can choose a fallback.
class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& message, int system_errno = 0)
        : std::runtime_error(message), system_errno_(system_errno) {}
    [[nodiscard]] int system_errno() const { return system_errno_; }

  private:
    int system_errno_;
};

// Error built from errno: "<what>: <strerror(errno)>".
[[nodiscard]] Error system_error(const std::string& what, int err);
[[nodiscard]] Error system_error(const std::string& what);

// Prints "sqbox: <message>" to stderr (or the diagnostics descriptor) with a single write, so
// lines from several processes never interleave mid-line.
void print_error(const std::string& message);

// Where print_error writes from now on, owned for the rest of the process: the caller's real
// stderr when the payload's stderr is a relay pipe (sqbox's own messages must not count against
// --output-limit). Processes forked later inherit it; they keep it among their descriptors.
void adopt_diagnostics_fd(UniqueFd fd);
// The descriptor print_error writes to when it is not fd 2; -1 if none.
int diagnostics_fd();

}  // namespace sqbox

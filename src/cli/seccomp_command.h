// `sqbox seccomp check PROFILE`: validates a seccomp profile without running anything.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace sqbox::cli {

// Exit statuses of `sqbox seccomp check` (documented in docs/run.md).
inline constexpr int kCheckValid = 0;
inline constexpr int kCheckInvalid = 1;
inline constexpr int kCheckUnknownNames = 2;

struct SeccompCheckArguments {
    std::string profile;
};

// Declares `seccomp` and its `check` subcommand on `app`; returns the `check` subcommand.
CLI::App* add_seccomp_subcommand(CLI::App& app, SeccompCheckArguments& args);

// Parses and compiles the profile (a file, or "default"/"strict"); prints a summary on stdout,
// each unknown syscall name as "PROFILE:LINE: ..." on stderr, and returns an exit status above.
int execute_seccomp_check(const SeccompCheckArguments& args);

}  // namespace sqbox::cli

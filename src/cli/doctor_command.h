// `sqbox doctor [IMAGE] [--json]`: checks everything `sqbox run` depends on here
// (runtime/host_checks.h) and prints each check's status, what sqbox does about it and the fix.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace sqbox::cli {

// Exit statuses of `sqbox doctor` (documented in docs/doctor.md); bad options exit 125.
inline constexpr int kDoctorRunWorks = 0;
inline constexpr int kDoctorRunFails = 1;

struct DoctorArguments {
    std::string image;
    std::string cgroup;
    bool json = false;
};

CLI::App* add_doctor_subcommand(CLI::App& app, DoctorArguments& args);

// Runs the checks, prints them (text, or one JSON object with --json) on stdout and returns an
// exit status above.
int execute_doctor(const DoctorArguments& args);

}  // namespace sqbox::cli

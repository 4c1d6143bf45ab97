#include "cli/doctor_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "runtime/host_checks.h"

namespace sqbox::cli {
namespace {

void print_text(const std::vector<HostCheck>& checks, bool works) {
    for (const HostCheck& check : checks) {
        std::cout << check.name << ": " << check_status_name(check.status) << ": " << check.found
                  << "\n";
        if (check.status != CheckStatus::kOk) {
            std::cout << "    sqbox " << check.action << "\n";
            if (!check.fix.empty()) std::cout << "    fix: " << check.fix << "\n";
        }
    }
    std::cout << (works ? "sqbox run works here" : "sqbox run does not work here") << "\n";
}

void print_json(const std::vector<HostCheck>& checks, bool works) {
    nlohmann::json list = nlohmann::json::array();
    for (const HostCheck& check : checks) {
        list.push_back({{"name", check.name},
                        {"status", check_status_name(check.status)},
                        {"found", check.found},
                        {"action", check.action},
                        {"fix", check.fix}});
    }
    const nlohmann::json report = {{"run_works", works},
                                   {"exit_code", works ? kDoctorRunWorks : kDoctorRunFails},
                                   {"checks", list}};
    std::cout << report.dump() << "\n";
}

}  // namespace

CLI::App* add_doctor_subcommand(CLI::App& app, DoctorArguments& args) {
    CLI::App* doctor = app.add_subcommand(
        "doctor",
        "Check what sqbox run needs on this machine (and IMAGE): exit 0 if run works, 1 if not");
    doctor->add_option("IMAGE", args.image,
                       "a squashfs image (.sqsh) or root filesystem directory");
    doctor->add_option("--cgroup", args.cgroup,
                       "check this delegated cgroup v2 directory, as run --cgroup would use it");
    doctor->add_flag("--json", args.json, "print one JSON object instead of text");
    return doctor;
}

int execute_doctor(const DoctorArguments& args) {
    DoctorOptions options;
    if (!args.image.empty()) options.image = args.image;
    options.cgroup_parent = args.cgroup;
    const std::vector<HostCheck> checks = run_host_checks(options);
    const bool works = run_will_work(checks);
    if (args.json) {
        print_json(checks, works);
    } else {
        print_text(checks, works);
    }
    return works ? kDoctorRunWorks : kDoctorRunFails;
}

}  // namespace sqbox::cli

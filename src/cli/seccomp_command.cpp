#include "cli/seccomp_command.h"

#include <seccomp.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "security/seccomp_choice.h"
#include "util/errors.h"

namespace sqbox::cli {

CLI::App* add_seccomp_subcommand(CLI::App& app, SeccompCheckArguments& args) {
    CLI::App* seccomp = app.add_subcommand("seccomp", "Work with seccomp profiles");
    seccomp->require_subcommand(1);
    CLI::App* check = seccomp->add_subcommand(
        "check",
        "Validate a profile in Docker's JSON format: exit 0 if usable, 1 if not, 2 if usable but "
        "naming system calls libseccomp does not know");
    check->add_option("PROFILE", args.profile, "a JSON file, or the built-in default or strict")
        ->required();
    return check;
}

int execute_seccomp_check(const SeccompCheckArguments& args) {
    try {
        SeccompProfile profile = load_seccomp_profile(args.profile);
        SeccompTarget target = sandbox_seccomp_target();
        SeccompFilter filter = compile_seccomp_filter(profile, target);
        for (const auto& unknown : filter.unknown_syscalls) {
            std::cerr << profile.origin << ":" << unknown.line << ": unknown system call '"
                      << unknown.name << "' (libseccomp does not know it; the name is skipped)\n";
        }
        const char* arch = ::seccomp_arch_resolve_name("x86_64") == ::seccomp_arch_native()
                               ? "x86_64"
                               : "this architecture";
        std::cout << profile.origin << ": " << profile.rules.size() << " rules, "
                  << filter.rules_applied << " syscall rules for " << arch << " on kernel "
                  << target.kernel_major << "." << target.kernel_minor << ", "
                  << filter.program.size() << " BPF instructions";
        if (!filter.unknown_syscalls.empty()) {
            std::cout << "; " << filter.unknown_syscalls.size() << " unknown system call name(s)\n";
            return kCheckUnknownNames;
        }
        std::cout << ": ok\n";
        return kCheckValid;
    } catch (const Error& e) {
        print_error(e.what());
        return kCheckInvalid;
    }
}

}  // namespace sqbox::cli

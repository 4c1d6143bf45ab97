#include "security/seccomp_choice.h"

#include "security/builtin_profiles.h"

namespace sqbox {

SeccompProfile load_seccomp_profile(const std::string& name_or_path) {
    if (const BuiltinSeccompProfile* builtin = find_builtin_seccomp_profile(name_or_path)) {
        return parse_seccomp_profile(std::string(builtin->json), name_or_path + ".json (built in)");
    }
    return load_seccomp_profile_file(name_or_path);
}

bool allows_seccomp_before_root_ready(const std::string& choice) {
    return choice == "none" || find_builtin_seccomp_profile(choice) != nullptr;
}

std::optional<SeccompFilter> prepare_seccomp(const std::string& choice) {
    if (choice == "none") {
        print_error(
            "warning: --seccomp none: the payload may use every system call the kernel offers "
            "(for debugging only)");
        return std::nullopt;
    }
    if (const BuiltinSeccompProfile* builtin = find_builtin_seccomp_profile(choice)) {
        SeccompFilter filter;
        filter.program.assign(builtin->program.begin(), builtin->program.end());
        filter.flags = builtin->flags;
        filter.rules_applied = builtin->rules_applied;
        return filter;
    }
    try {
        return compile_seccomp_filter(load_seccomp_profile_file(choice), sandbox_seccomp_target());
    } catch (const SeccompProfileError& e) {
        throw Error(std::string("--seccomp ") + e.what());
    }
}

}  // namespace sqbox

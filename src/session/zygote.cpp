#include "session/zygote.h"

#include <sys/syscall.h>

#include "security/landlock.h"
#include "security/zygote_seccomp.h"
#include "session/prestart.h"
#include "session/protocol_lines.h"
#include "util/errors.h"
#include "util/text.h"

namespace sqbox {

std::string zygote_settings(const SandboxPlan& plan, const SandboxConfig& base) {
    if (!plan.seccomp) throw Error("--zygote needs a seccomp profile");
    check_refuses_namespaces(*plan.seccomp, base.seccomp_profile);
    json landlock = nullptr;
    if (plan.landlock_abi > 0) {
        const LandlockRuleset rules = payload_landlock_ruleset(plan.landlock_abi);
        landlock = {{"handled_fs", rules.handled_fs},
                    {"scoped", rules.scoped},
                    {"attr_size", rules.attr_size},
                    {"allowed_beneath_root", rules.allowed_beneath_root}};
    }
    return json{
        {"filter", hex_of({reinterpret_cast<const unsigned char*>(plan.seccomp->program.data()),
                           plan.seccomp->program.size() * sizeof(sock_filter)})},
        {"filter_flags", plan.seccomp->flags},
        {"landlock", landlock},
        {"namespaces", kZygoteNamespaces},
        {"tmpfs_size", base.tmpfs_size_bytes},
        {"lower", kZygoteLowerDir},
        {"pids", base.limits.processes ? json(*base.limits.processes) : json(nullptr)},
        {"syscalls",
         {{"clone", SYS_clone},
          {"pivot_root", SYS_pivot_root},
          {"capset", SYS_capset},
          {"seccomp", SYS_seccomp},
          {"landlock_create_ruleset", SYS_landlock_create_ruleset},
          {"landlock_add_rule", SYS_landlock_add_rule},
          {"landlock_restrict_self", SYS_landlock_restrict_self}}}}
        .dump();
}

std::vector<std::string> zygote_command(const std::string& settings,
                                        const std::vector<std::string>& preload) {
    std::vector<std::string> command = {"python3", "-c", python_stub_program(zygote_stub_source()),
                                        settings};
    command.insert(command.end(), preload.begin(), preload.end());
    return command;
}

}  // namespace sqbox

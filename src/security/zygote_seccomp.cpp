#include "security/zygote_seccomp.h"

#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/syscall.h>

#include <algorithm>
#include <array>

#include "security/seccomp_bpf_eval.h"
#include "security/seccomp_choice.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// What the zygote's child calls to make a request's sandbox, beyond any payload's calls.
constexpr std::array<const char*, 3> kMountCalls = {"mount", "umount2", "pivot_root"};

// Rules the zygote's own replace: whatever the profile says of the mount calls, and what it
// refuses of clone (the profile's clone rules that allow stay).
bool replaced(const std::string& name, const SeccompRule& rule) {
    if (name == "clone") return rule.action.libseccomp_action != SCMP_ACT_ALLOW;
    return std::find(kMountCalls.begin(), kMountCalls.end(), name) != kMountCalls.end();
}

SeccompRule allow_rule(std::vector<std::string> names) {
    SeccompRule rule;
    rule.names = std::move(names);
    rule.name_lines.assign(rule.names.size(), 0);
    rule.action = {SCMP_ACT_ALLOW, "SCMP_ACT_ALLOW"};
    return rule;
}

bool allowed(const SeccompFilter& filter, int nr, uint64_t first_argument) {
    SyscallCall call;
    call.nr = nr;
    call.args[0] = first_argument;
    return (evaluate_seccomp(filter.program, call) & SECCOMP_RET_ACTION_FULL) == SECCOMP_RET_ALLOW;
}

}  // namespace

void check_refuses_namespaces(const SeccompFilter& request_filter, const std::string& choice) {
    if (allowed(request_filter, SYS_unshare, CLONE_NEWUSER) ||
        allowed(request_filter, SYS_clone, CLONE_NEWUSER) ||
        allowed(request_filter, SYS_mount, 0)) {
        throw Error("--zygote: the seccomp profile '" + choice +
                    "' lets code make namespaces or mounts; the zygote relies on it to keep "
                    "each request in the sandbox made for it");
    }
}

void check_zygote_seccomp_choice(const std::string& choice) {
    if (choice == "none") {
        throw Error("--zygote needs a seccomp profile: it keeps each request in its own sandbox");
    }
}

SeccompFilter compile_zygote_seccomp_filter(const std::string& choice) {
    check_zygote_seccomp_choice(choice);
    SeccompProfile profile = load_seccomp_profile(choice);
    for (SeccompRule& rule : profile.rules) {
        std::vector<std::string> names;
        std::vector<int> lines;
        for (size_t i = 0; i < rule.names.size(); ++i) {
            if (replaced(rule.names[i], rule)) continue;
            names.push_back(rule.names[i]);
            lines.push_back(i < rule.name_lines.size() ? rule.name_lines[i] : rule.line);
        }
        rule.names = std::move(names);
        rule.name_lines = std::move(lines);
    }
    std::erase_if(profile.rules, [](const SeccompRule& rule) { return rule.names.empty(); });
    SeccompRule clone = allow_rule({"clone"});
    // All bits compared: a fork into exactly these namespaces, nothing else (no CLONE_VM).
    clone.args.push_back({0, ~uint64_t{0}, kZygoteCloneFlags, SCMP_CMP_MASKED_EQ});
    profile.rules.push_back(std::move(clone));
    profile.rules.push_back(allow_rule({kMountCalls.begin(), kMountCalls.end()}));
    try {
        return compile_seccomp_filter(profile, sandbox_seccomp_target());
    } catch (const SeccompProfileError& e) {
        throw Error(std::string("--zygote: ") + e.what());
    }
}

}  // namespace sqbox

#include "runtime/sandbox_plan.h"

#include "security/landlock.h"
#include "security/seccomp_choice.h"

namespace sqbox {

SandboxPlan build_sandbox_plan(const SandboxConfig& config) {
    SandboxPlan plan;
    plan.config = &config;
    plan.seccomp = prepare_seccomp(config.seccomp_profile);
    plan.landlock_abi = landlock_abi_version();
    plan.seccomp_before_root_ready = allows_seccomp_before_root_ready(config.seccomp_profile);
    plan.rlimits = config.limits;
    return plan;
}

void make_zygote_plan(SandboxPlan& plan, const SeccompFilter& zygote_filter) {
    plan.seccomp = zygote_filter;
    plan.seccomp_before_root_ready = false;
    plan.landlock_abi = 0;
}

}  // namespace sqbox

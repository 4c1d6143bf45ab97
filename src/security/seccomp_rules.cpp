#include "security/seccomp_rules.h"

#include <cstring>
#include <utility>

#include "util/errors.h"

namespace sqbox {

SeccompRules::SeccompRules(uint32_t default_action, std::string what)
    : what_(std::move(what)), filter_(::seccomp_init(default_action), ::seccomp_release) {
    if (!filter_) throw Error(what_ + " seccomp filter: seccomp_init failed");
    check(::seccomp_attr_set(filter_.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
          "badarch");
}

void SeccompRules::add(uint32_t action, const char* name,
                       const std::vector<scmp_arg_cmp>& conditions) {
    const int number = ::seccomp_syscall_resolve_name(name);
    if (number == __NR_SCMP_ERROR) return;  // not a system call of this architecture
    check(::seccomp_rule_add_array(filter_.get(), action, number,
                                   static_cast<unsigned>(conditions.size()), conditions.data()),
          name);
}

void SeccompRules::load() {
    check(::seccomp_load(filter_.get()), "load");
}

void SeccompRules::check(int err, const char* operation) const {
    if (err < 0) {
        throw Error(what_ + " seccomp filter (" + operation + "): " + std::strerror(-err));
    }
}

}  // namespace sqbox

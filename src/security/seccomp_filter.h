// Turns a parsed seccomp profile into the BPF program the payload installs just before exec.
// Compiling happens in the launcher, before any namespace exists, so a bad profile fails early
// and the payload only has to hand a ready program to the kernel.
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include "security/seccomp_profile.h"

namespace sqbox {

// What the rules' "includes"/"excludes" are evaluated against.
struct SeccompTarget {
    std::vector<std::string> capabilities;  // held by the payload: none, in sqbox
    unsigned kernel_major = 0;
    unsigned kernel_minor = 0;
};

// This machine's kernel, and a payload without capabilities.
SeccompTarget sandbox_seccomp_target();

struct UnknownSyscall {
    std::string name;
    int line = 0;
};

struct SeccompFilter {
    std::vector<sock_filter> program;
    unsigned flags = 0;        // SECCOMP_FILTER_FLAG_* for seccomp(2)
    size_t rules_applied = 0;  // (syscall, condition set) pairs that made it into the filter
    std::vector<UnknownSyscall> unknown_syscalls;  // names libseccomp does not know (skipped)
};

// Throws SeccompProfileError ("<origin>:<line>: ...") when libseccomp rejects a rule.
SeccompFilter compile_seccomp_filter(const SeccompProfile& profile, const SeccompTarget& target);

// The same filter, smaller where it can be (security/seccomp_range_dispatch.h): libseccomp's own
// program for the calls with argument rules, then, for every other call, a search over runs of
// call numbers instead of libseccomp's comparison per call; about half the instructions for
// sqbox's own profiles, so the kernel has half as much to compile whenever a sandbox installs it.
// Used only if it gives the same answer as compile_seccomp_filter's program to every call number
// of every architecture (whatever the arguments, where libseccomp's program does not read them),
// and to the argument values the rules compare with; a few milliseconds of checking, hence done
// when sqbox is built, for the built-in profiles. Otherwise that program is returned unchanged.
SeccompFilter compile_compact_seccomp_filter(const SeccompProfile& profile,
                                             const SeccompTarget& target);

// Installs `filter` on the calling thread; no_new_privs must already be set.
void install_seccomp_filter(const SeccompFilter& filter);

}  // namespace sqbox

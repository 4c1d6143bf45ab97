#include "security/seccomp_filter.h"

#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "util/files.h"

namespace sqbox {
namespace {

using FilterContext = std::unique_ptr<void, decltype(&::seccomp_release)>;

// Docker's profiles name architectures in "includes"/"excludes" the way Go does.
std::string go_architecture_name(uint32_t arch) {
    switch (arch) {
        case SCMP_ARCH_X86_64:
            return "amd64";
        case SCMP_ARCH_X86:
            return "x86";
        case SCMP_ARCH_X32:
            return "x32";
        case SCMP_ARCH_AARCH64:
            return "arm64";
        case SCMP_ARCH_ARM:
            return "arm";
        case SCMP_ARCH_PPC64LE:
            return "ppc64le";
        case SCMP_ARCH_S390X:
            return "s390x";
        case SCMP_ARCH_RISCV64:
            return "riscv64";
        default:
            return "unknown";
    }
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
    return std::find(list.begin(), list.end(), item) != list.end();
}

bool kernel_at_least(const SeccompTarget& target, const std::string& version) {
    unsigned major = 0;
    unsigned minor = 0;
    (void)std::sscanf(version.c_str(), "%u.%u", &major, &minor);  // validated by the parser
    return target.kernel_major != major ? target.kernel_major > major
                                        : target.kernel_minor >= minor;
}

// Docker's rule selection: excludes first (any match drops the rule), then includes (all must
// hold). Capabilities are those the payload really has.
bool rule_applies(const SeccompRule& rule, const SeccompTarget& target, const std::string& arch) {
    const SeccompRuleFilter& ex = rule.excludes;
    if (contains(ex.arches, arch)) return false;
    if (std::any_of(ex.caps.begin(), ex.caps.end(),
                    [&](const std::string& cap) { return contains(target.capabilities, cap); })) {
        return false;
    }
    if (ex.min_kernel && kernel_at_least(target, *ex.min_kernel)) return false;
    const SeccompRuleFilter& in = rule.includes;
    if (!in.arches.empty() && !contains(in.arches, arch)) return false;
    if (!std::all_of(in.caps.begin(), in.caps.end(),
                     [&](const std::string& cap) { return contains(target.capabilities, cap); })) {
        return false;
    }
    if (in.min_kernel && !kernel_at_least(target, *in.min_kernel)) return false;
    return true;
}

void add_architecture(void* context, const std::string& name, const std::string& origin) {
    const uint32_t token = ::seccomp_arch_resolve_name(name.c_str());
    const int rc = ::seccomp_arch_add(context, token);
    if (rc != 0 && rc != -EEXIST) {
        throw SeccompProfileError(origin + ": cannot add architecture " + name + ": " +
                                  std::strerror(-rc));
    }
}

// Conditions of one rule as libseccomp rules: all together (AND), unless several test the same
// argument, which libseccomp cannot express; then each is its own rule (OR), as runc does.
std::vector<std::vector<scmp_arg_cmp>> condition_sets(const SeccompRule& rule) {
    std::vector<scmp_arg_cmp> all;
    std::array<int, 6> per_index{};
    for (const auto& arg : rule.args) {
        all.push_back({arg.index, static_cast<scmp_compare>(arg.op), arg.value, arg.value_two});
        ++per_index[arg.index];
    }
    if (std::any_of(per_index.begin(), per_index.end(), [](int n) { return n > 1; })) {
        std::vector<std::vector<scmp_arg_cmp>> separate;
        separate.reserve(all.size());
        for (const auto& cmp : all) separate.push_back({cmp});
        return separate;
    }
    return {all};
}

std::vector<sock_filter> export_program(void* context) {
    UniqueFd memory(::memfd_create("sqbox-seccomp", MFD_CLOEXEC));
    if (!memory) throw system_error("memfd_create for the seccomp filter");
    int rc = ::seccomp_export_bpf(context, memory.get());
    if (rc != 0) throw Error(std::string("cannot build the seccomp filter: ") + std::strerror(-rc));
    if (::lseek(memory.get(), 0, SEEK_SET) != 0) throw system_error("lseek seccomp filter");
    std::string bytes = read_all(memory.get(), "the seccomp filter");
    if (bytes.empty() || bytes.size() % sizeof(sock_filter) != 0) {
        throw Error("libseccomp produced a malformed filter");
    }
    std::vector<sock_filter> program(bytes.size() / sizeof(sock_filter));
    std::memcpy(program.data(), bytes.data(), bytes.size());
    return program;
}

}  // namespace

SeccompTarget sandbox_seccomp_target() {
    SeccompTarget target;
    utsname name{};
    if (::uname(&name) == 0) {
        (void)std::sscanf(name.release, "%u.%u", &target.kernel_major, &target.kernel_minor);
    }
    return target;
}

SeccompFilter compile_seccomp_filter(const SeccompProfile& profile, const SeccompTarget& target) {
    const uint32_t default_action = profile.default_action.libseccomp_action;
    FilterContext context(::seccomp_init(default_action), ::seccomp_release);
    if (!context) {
        throw SeccompProfileError(profile.origin + ": libseccomp refused the default action");
    }
    // A call from an architecture the profile does not cover fails like an unknown call: the
    // payload gets ENOSYS instead of being killed without a word.
    if (::seccomp_attr_set(context.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(ENOSYS)) != 0 ||
        ::seccomp_attr_set(context.get(), SCMP_FLTATR_CTL_NNP, 0) != 0 ||
        ::seccomp_attr_set(context.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2) != 0) {
        throw Error("cannot configure libseccomp");
    }

    const uint32_t native = ::seccomp_arch_native();
    for (const auto& mapping : profile.arch_map) {
        if (::seccomp_arch_resolve_name(mapping.architecture.c_str()) != native) continue;
        for (const auto& sub : mapping.sub_architectures) {
            add_architecture(context.get(), sub, profile.origin);
        }
    }
    for (const auto& arch : profile.architectures) {
        add_architecture(context.get(), arch, profile.origin);
    }

    SeccompFilter filter;
    const std::string arch = go_architecture_name(native);
    for (const auto& rule : profile.rules) {
        if (!rule_applies(rule, target, arch)) continue;
        const uint32_t action = rule.action.libseccomp_action;
        for (size_t i = 0; i < rule.names.size(); ++i) {
            const std::string& name = rule.names[i];
            const int line = i < rule.name_lines.size() ? rule.name_lines[i] : rule.line;
            const int number = ::seccomp_syscall_resolve_name(name.c_str());
            if (number == __NR_SCMP_ERROR) {
                filter.unknown_syscalls.push_back({name, line});
                continue;
            }
            if (action == default_action) continue;  // already what happens; libseccomp refuses
            for (const auto& conditions : condition_sets(rule)) {
                const int rc = ::seccomp_rule_add_array(context.get(), action, number,
                                                        static_cast<unsigned>(conditions.size()),
                                                        conditions.data());
                if (rc != 0) {
                    throw SeccompProfileError(profile.origin + ":" + std::to_string(line) +
                                              ": libseccomp rejects the rule for " + name + ": " +
                                              std::strerror(-rc));
                }
                ++filter.rules_applied;
            }
        }
    }
    filter.program = export_program(context.get());
    for (const auto& flag : profile.flags) {
        if (flag == "SECCOMP_FILTER_FLAG_LOG") filter.flags |= SECCOMP_FILTER_FLAG_LOG;
        if (flag == "SECCOMP_FILTER_FLAG_SPEC_ALLOW") {
            filter.flags |= SECCOMP_FILTER_FLAG_SPEC_ALLOW;
        }
    }
    return filter;
}

void install_seccomp_filter(const SeccompFilter& filter) {
    sock_fprog program{static_cast<unsigned short>(filter.program.size()),
                       const_cast<sock_filter*>(filter.program.data())};
    if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, filter.flags, &program) != 0) {
        throw system_error("cannot install the seccomp filter");
    }
}

}  // namespace sqbox

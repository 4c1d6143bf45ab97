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
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "security/seccomp_bpf_eval.h"
#include "security/seccomp_range_dispatch.h"
#include "util/files.h"

namespace sqbox {
namespace {

using FilterContext = std::unique_ptr<void, decltype(&::seccomp_release)>;

constexpr uint32_t kBadArchitectureAction = SCMP_ACT_ERRNO(ENOSYS);

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

// Returns the architecture's token.
uint32_t add_architecture(void* context, const std::string& name, const std::string& origin) {
    const uint32_t token = ::seccomp_arch_resolve_name(name.c_str());
    const int rc = ::seccomp_arch_add(context, token);
    if (rc != 0 && rc != -EEXIST) {
        throw SeccompProfileError(origin + ": cannot add architecture " + name + ": " +
                                  std::strerror(-rc));
    }
    return token;
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

namespace {

// A rule's system call as libseccomp numbers it on this architecture.
struct ResolvedName {
    const SeccompRule* rule = nullptr;
    int number = 0;
    int line = 0;
    std::string name;
};

// The rules that apply to `target`, one entry per known system call they name; names libseccomp
// does not know go to `unknown`.
std::vector<ResolvedName> resolve_rules(const SeccompProfile& profile, const SeccompTarget& target,
                                        std::vector<UnknownSyscall>& unknown) {
    std::vector<ResolvedName> resolved;
    const std::string arch = go_architecture_name(::seccomp_arch_native());
    for (const auto& rule : profile.rules) {
        if (!rule_applies(rule, target, arch)) continue;
        for (size_t i = 0; i < rule.names.size(); ++i) {
            const std::string& name = rule.names[i];
            const int line = i < rule.name_lines.size() ? rule.name_lines[i] : rule.line;
            const int number = ::seccomp_syscall_resolve_name(name.c_str());
            if (number == __NR_SCMP_ERROR) {
                unknown.push_back({name, line});
                continue;
            }
            resolved.push_back({&rule, number, line, name});
        }
    }
    return resolved;
}

// A libseccomp filter of the profile's architectures answering `default_action` to what no rule
// matches; `only` picks the calls whose rules go in (all by default). Rules whose action is the
// profile's default are left out: they change nothing (and libseccomp refuses them).
// `single_architecture` says whether the filter covers the native architecture alone.
struct BuiltContext {
    FilterContext context{nullptr, ::seccomp_release};
    size_t rules_applied = 0;
    bool single_architecture = true;
};

BuiltContext build_context(const SeccompProfile& profile, const std::vector<ResolvedName>& resolved,
                           uint32_t default_action, const std::function<bool(int)>& only) {
    BuiltContext built;
    built.context.reset(::seccomp_init(default_action));
    void* const context = built.context.get();
    if (context == nullptr) {
        throw SeccompProfileError(profile.origin + ": libseccomp refused the default action");
    }
    // A call from an architecture the profile does not cover fails like an unknown call: the
    // payload gets ENOSYS instead of being killed without a word.
    if (::seccomp_attr_set(context, SCMP_FLTATR_ACT_BADARCH, kBadArchitectureAction) != 0 ||
        ::seccomp_attr_set(context, SCMP_FLTATR_CTL_NNP, 0) != 0 ||
        ::seccomp_attr_set(context, SCMP_FLTATR_CTL_OPTIMIZE, 2) != 0) {
        throw Error("cannot configure libseccomp");
    }

    const uint32_t native = ::seccomp_arch_native();
    auto add = [&](const std::string& name) {
        if (add_architecture(context, name, profile.origin) != native) {
            built.single_architecture = false;
        }
    };
    for (const auto& mapping : profile.arch_map) {
        if (::seccomp_arch_resolve_name(mapping.architecture.c_str()) != native) continue;
        for (const auto& sub : mapping.sub_architectures) add(sub);
    }
    for (const auto& arch : profile.architectures) add(arch);

    for (const ResolvedName& entry : resolved) {
        const uint32_t action = entry.rule->action.libseccomp_action;
        if (action == profile.default_action.libseccomp_action || !only(entry.number)) continue;
        for (const auto& conditions : condition_sets(*entry.rule)) {
            const int rc = ::seccomp_rule_add_array(context, action, entry.number,
                                                    static_cast<unsigned>(conditions.size()),
                                                    conditions.data());
            if (rc != 0) {
                throw SeccompProfileError(profile.origin + ":" + std::to_string(entry.line) +
                                          ": libseccomp rejects the rule for " + entry.name + ": " +
                                          std::strerror(-rc));
            }
            ++built.rules_applied;
        }
    }
    return built;
}

unsigned filter_flags(const SeccompProfile& profile) {
    unsigned flags = 0;
    for (const auto& flag : profile.flags) {
        if (flag == "SECCOMP_FILTER_FLAG_LOG") flags |= SECCOMP_FILTER_FLAG_LOG;
        if (flag == "SECCOMP_FILTER_FLAG_SPEC_ALLOW") flags |= SECCOMP_FILTER_FLAG_SPEC_ALLOW;
    }
    return flags;
}

// The calls on which `compact` must answer as `reference` does: every number up to 1023 and the
// same with the x32 bit, a few extremes, from several architectures; for the calls whose
// arguments are checked (answered by libseccomp's own code in both programs), arguments at and
// around the rules' values and mixes of them, which lead both into that code and, with no rule
// holding, out of it to `compact`'s search.
std::vector<SyscallCall> probe_calls(const std::vector<ResolvedName>& resolved,
                                     const std::set<int>& conditional) {
    std::vector<SyscallCall> calls;
    const uint32_t archs[] = {::seccomp_arch_native(), AUDIT_ARCH_X86_64, AUDIT_ARCH_I386,
                              AUDIT_ARCH_AARCH64,      AUDIT_ARCH_ARM,    0};
    std::vector<int> numbers;
    for (int nr = 0; nr < 1024; ++nr) {
        numbers.push_back(nr);
        numbers.push_back(static_cast<int>(0x40000000U | static_cast<uint32_t>(nr)));
    }
    for (uint32_t extreme : {0x3fffffffU, 0x7fffffffU, 0x80000000U, 0xfffffffeU, 0xffffffffU}) {
        numbers.push_back(static_cast<int>(extreme));
    }
    for (uint32_t arch : archs) {
        for (int nr : numbers) calls.push_back({nr, arch, {}});
    }
    // Per argument, the values the rules compare it with and their neighbours.
    std::map<int, std::array<std::vector<uint64_t>, 6>> interesting;
    for (const ResolvedName& entry : resolved) {
        if (conditional.count(entry.number) == 0) continue;
        auto& values = interesting[entry.number];
        for (const auto& arg : entry.rule->args) {
            for (uint64_t v : {arg.value, arg.value_two}) {
                for (uint64_t near : {v, v - 1, v + 1, ~v, v | (uint64_t{1} << 32), v & 0xffffffffU,
                                      v ^ arg.value_two, v & arg.value_two}) {
                    values[arg.index].push_back(near);
                }
            }
        }
    }
    uint64_t state = 0x9e3779b97f4a7c15U;  // a fixed sequence: the check is reproducible
    auto next_random = [&state] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    };
    for (auto& [nr, values] : interesting) {
        for (auto& list : values) {
            for (uint64_t v : {uint64_t{0}, ~uint64_t{0}, uint64_t{0xffffffff}}) list.push_back(v);
        }
        for (unsigned index = 0; index < 6; ++index) {
            for (uint64_t v : values[index]) {
                SyscallCall call{nr, ::seccomp_arch_native(), {}};
                call.args[index] = v;
                calls.push_back(call);
            }
        }
        for (int i = 0; i < 2000; ++i) {
            SyscallCall call{nr, ::seccomp_arch_native(), {}};
            for (unsigned index = 0; index < 6; ++index) {
                const auto& list = values[index];
                const uint64_t pick = next_random();
                call.args[index] = (pick & 3) == 0 ? next_random() : list[pick % list.size()];
            }
            calls.push_back(call);
        }
    }
    return calls;
}

// Every call number and architecture, arguments 0, in one call per stretch of numbers and of
// architectures over which neither program can change its answer (seccomp_bpf_eval.h's
// word_boundaries): a few thousand calls that stand for all 2^64. nullopt if a program does more
// with the number or the architecture than compare them.
std::optional<std::vector<SyscallCall>> every_number_calls(
    const std::vector<sock_filter>& reference, const std::vector<sock_filter>& compact) {
    std::set<uint32_t> numbers;
    std::set<uint32_t> archs;
    for (const std::vector<sock_filter>* program : {&reference, &compact}) {
        const auto program_numbers = word_boundaries(*program, offsetof(seccomp_data, nr));
        const auto program_archs = word_boundaries(*program, offsetof(seccomp_data, arch));
        if (!program_numbers || !program_archs) return std::nullopt;
        numbers.insert(program_numbers->begin(), program_numbers->end());
        archs.insert(program_archs->begin(), program_archs->end());
    }
    std::vector<SyscallCall> calls;
    calls.reserve(numbers.size() * archs.size());
    for (uint32_t arch : archs) {
        for (uint32_t nr : numbers) calls.push_back({static_cast<int>(nr), arch, {}});
    }
    return calls;
}

// Whether `compact` answers every probe as `reference` does, and every call `reference` answers
// from its number and architecture alone (which the kernel's action cache can answer without
// running it, when that answer is to allow) `compact` answers so too. With every_number_calls
// among the probes, this holds for every call number and architecture: whatever the arguments
// where `reference` does not read them, with arguments 0 where it does (there both run
// libseccomp's code for the call's rules).
bool answers_alike(const std::vector<sock_filter>& reference,
                   const std::vector<sock_filter>& compact,
                   const std::vector<SyscallCall>& probes) {
    try {
        for (const SyscallCall& call : probes) {
            if (evaluate_seccomp(reference, call) != evaluate_seccomp(compact, call)) return false;
            const bool args_zero = std::all_of(call.args.begin(), call.args.end(),
                                               [](uint64_t arg) { return arg == 0; });
            if (!args_zero) continue;
            const std::optional<uint32_t> fixed =
                constant_seccomp_answer(reference, call.nr, call.arch);
            if (fixed && constant_seccomp_answer(compact, call.nr, call.arch) != fixed) {
                return false;
            }
        }
    } catch (const Error&) {
        return false;
    }
    return true;
}

// libseccomp's filter of every rule in `resolved`.
SeccompFilter libseccomp_filter(const SeccompProfile& profile,
                                const std::vector<ResolvedName>& resolved,
                                std::vector<UnknownSyscall> unknown) {
    SeccompFilter filter;
    filter.unknown_syscalls = std::move(unknown);
    const BuiltContext built = build_context(
        profile, resolved, profile.default_action.libseccomp_action, [](int) { return true; });
    filter.program = export_program(built.context.get());
    filter.rules_applied = built.rules_applied;
    filter.flags = filter_flags(profile);
    return filter;
}

}  // namespace

SeccompFilter compile_seccomp_filter(const SeccompProfile& profile, const SeccompTarget& target) {
    std::vector<UnknownSyscall> unknown;
    const std::vector<ResolvedName> resolved = resolve_rules(profile, target, unknown);
    return libseccomp_filter(profile, resolved, std::move(unknown));
}

SeccompFilter compile_compact_seccomp_filter(const SeccompProfile& profile,
                                             const SeccompTarget& target) {
    std::vector<UnknownSyscall> unknown;
    const std::vector<ResolvedName> resolved = resolve_rules(profile, target, unknown);
    SeccompFilter filter = libseccomp_filter(profile, resolved, std::move(unknown));
    const uint32_t default_action = profile.default_action.libseccomp_action;
    std::set<int> conditional;
    std::set<uint32_t> actions = {default_action, kBadArchitectureAction};
    for (const ResolvedName& entry : resolved) {
        actions.insert(entry.rule->action.libseccomp_action);
        if (!entry.rule->args.empty() && entry.rule->action.libseccomp_action != default_action) {
            conditional.insert(entry.number);
        }
    }
    // What libseccomp's part answers where it has no rule: a value no rule uses.
    uint32_t sentinel = SCMP_ACT_TRACE(0x5b0c);
    while (actions.count(sentinel) != 0) ++sentinel;

    // libseccomp's own program for the calls with argument rules (every rule of theirs, so their
    // answers are libseccomp's), with the architecture checks in front; what it leaves to
    // `sentinel` goes on to the search over the other calls' numbers.
    const BuiltContext part = build_context(profile, resolved, sentinel,
                                            [&](int nr) { return conditional.count(nr) != 0; });
    if (!part.single_architecture) return filter;  // numbers differ between architectures

    RangeDispatchParts parts;
    parts.sentinel = sentinel;
    parts.default_answer = default_action;
    parts.conditional = export_program(part.context.get());
    // The calls without argument rules: their answer does not depend on the arguments.
    for (const ResolvedName& entry : resolved) {
        if (conditional.count(entry.number) != 0 || entry.number < 0) continue;
        parts.plain_answers[static_cast<uint32_t>(entry.number)] = evaluate_seccomp(
            filter.program, SyscallCall{entry.number, ::seccomp_arch_native(), {}});
    }
    std::optional<std::vector<sock_filter>> compact = build_range_dispatch(parts);
    if (!compact || compact->size() >= filter.program.size()) return filter;
    std::optional<std::vector<SyscallCall>> probes = every_number_calls(filter.program, *compact);
    if (!probes) return filter;
    const std::vector<SyscallCall> more = probe_calls(resolved, conditional);
    probes->insert(probes->end(), more.begin(), more.end());
    if (answers_alike(filter.program, *compact, *probes)) filter.program = std::move(*compact);
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

// The seccomp profile parser and compiler, and what the shipped profiles answer to the calls a
// hostile payload would make (evaluated on the compiled BPF, in user space).
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <csignal>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "security/builtin_profiles.h"
#include "security/seccomp_bpf_eval.h"
#include "security/seccomp_filter.h"
#include "security/seccomp_profile.h"

namespace sqbox {
namespace {

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;

uint32_t errno_result(int err) {
    return SECCOMP_RET_ERRNO | static_cast<uint32_t>(err);
}
// Docker's own default profile, a real third-party file kept beside the checkout (not in it).
std::string docker_profile_text() {
    const char* dir = std::getenv("SQBOX_TESTDATA_DIR");
    const std::string path =
        std::string(dir != nullptr ? dir : SQBOX_TESTDATA_DIR) + "/docker-default-seccomp.json";
    std::ifstream in(path);
    if (!in) return {};
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

#define REQUIRE_DOCKER_PROFILE(text)                                                         \
    const std::string text = docker_profile_text();                                          \
    if (text.empty()) {                                                                      \
        GTEST_SKIP() << "Docker's default seccomp profile not found: it is expected in "     \
                        "../shared/testdata beside the checkout, or in $SQBOX_TESTDATA_DIR"; \
    }

std::string error_of(const std::string& text) {
    try {
        (void)compile_seccomp_filter(parse_seccomp_profile(text, "p.json"), SeccompTarget{});
    } catch (const SeccompProfileError& e) {
        return e.what();
    }
    return "no error";
}

// A built-in profile compiled as the build does (the program sqbox installs).
SeccompFilter compiled_builtin(const std::string& name) {
    const BuiltinSeccompProfile* builtin = find_builtin_seccomp_profile(name);
    EXPECT_NE(builtin, nullptr);
    return compile_compact_seccomp_filter(parse_seccomp_profile(std::string(builtin->json), name),
                                          SeccompTarget{});
}

// The same profile as libseccomp alone compiles it.
SeccompFilter libseccomp_builtin(const std::string& name) {
    const BuiltinSeccompProfile* builtin = find_builtin_seccomp_profile(name);
    EXPECT_NE(builtin, nullptr);
    return compile_seccomp_filter(parse_seccomp_profile(std::string(builtin->json), name),
                                  SeccompTarget{});
}

// Docker's profile compiled for a payload without capabilities on kernel MAJOR.MINOR.
SeccompFilter compiled_docker(const std::string& text, unsigned major, unsigned minor) {
    SeccompTarget target;
    target.kernel_major = major;
    target.kernel_minor = minor;
    return compile_seccomp_filter(parse_seccomp_profile(text, "docker.json"), target);
}

uint32_t answer(const SeccompFilter& filter, int nr, std::array<uint64_t, 6> args = {},
                uint32_t arch = AUDIT_ARCH_X86_64) {
    return evaluate_seccomp(filter.program, SyscallCall{nr, arch, args});
}

TEST(SeccompProfile, ReportsErrorsWithTheirLine) {
    EXPECT_EQ(error_of("{\"defaultAction\": \"SCMP_ACT_ERRNO\",\n \"syscalls\": [\n"
                       "  {\"names\": [\"read\"], \"action\": \"SCMP_ACT_NOPE\"}]}"),
              "p.json:3: syscalls[0].action: unknown action 'SCMP_ACT_NOPE'");
    EXPECT_EQ(error_of("{\"defaultAction\": \"SCMP_ACT_ERRNO\",\n\n \"defualtErrnoRet\": 1}"),
              "p.json:3: unknown field 'defualtErrnoRet'");
    EXPECT_EQ(error_of("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [{\"names\": "
                       "[\"read\"], \"action\": \"SCMP_ACT_ALLOW\",\n \"args\": [{\"index\": 6, "
                       "\"value\": 1, \"op\": \"SCMP_CMP_EQ\"}]}]}"),
              "p.json:2: syscalls[0].args[0]: index must be 0 to 5");
    EXPECT_EQ(error_of("{\n\"defaultAction\": \"SCMP_ACT_ALLOW\",\n \"syscalls\": [}"),
              "p.json:3: not valid JSON: syntax error while parsing value - unexpected '}'; "
              "expected '[', '{', or a literal");
    EXPECT_EQ(error_of("{\"syscalls\": []}"), "p.json:1: missing defaultAction");
}

TEST(SeccompProfile, UnknownSyscallNamesAreSkippedAndReportedWithTheirLine) {
    SeccompFilter filter = compile_seccomp_filter(
        parse_seccomp_profile("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
                              "{\"names\": [\"read\",\n \"opne\"], \"action\": "
                              "\"SCMP_ACT_ALLOW\"}]}",
                              "p.json"),
        SeccompTarget{});
    ASSERT_EQ(filter.unknown_syscalls.size(), 1u);
    EXPECT_EQ(filter.unknown_syscalls[0].name, "opne");
    EXPECT_EQ(filter.unknown_syscalls[0].line, 3);
    EXPECT_EQ(answer(filter, SYS_read), kAllow);
    EXPECT_EQ(answer(filter, SYS_write), errno_result(EPERM));  // Docker's default errno
}

TEST(SeccompProfile, DockersDefaultProfileLoadsUnchangedAndIsEvaluatedWithoutCapabilities) {
    REQUIRE_DOCKER_PROFILE(text);
    SeccompFilter filter = compiled_docker(text, 6, 1);
    EXPECT_EQ(answer(filter, SYS_read), kAllow);
    EXPECT_EQ(answer(filter, SYS_ptrace), kAllow);  // includes.minKernel 4.8 holds
    // includes.caps CAP_SYS_ADMIN: not held, so these stay at the default (EPERM).
    EXPECT_EQ(answer(filter, SYS_mount), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_bpf), errno_result(EPERM));
    // excludes.caps CAP_SYS_ADMIN: applies, since the payload lacks it.
    EXPECT_EQ(answer(filter, SYS_clone3), errno_result(ENOSYS));
    EXPECT_EQ(answer(filter, SYS_clone, {CLONE_NEWUSER}), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_clone, {CLONE_VM | CLONE_THREAD}), kAllow);
    // Its archMap lets 32-bit calls through to their own rules.
    EXPECT_EQ(answer(filter, 20 /* i386 getpid */, {}, AUDIT_ARCH_I386), kAllow);

    SeccompFilter old_kernel = compiled_docker(text, 4, 4);
    EXPECT_EQ(answer(old_kernel, SYS_ptrace), errno_result(EPERM));
}

TEST(SeccompProfile, BuiltinProgramsMatchACompileOfTheirText) {
    for (const char* name : {"default", "strict"}) {
        const BuiltinSeccompProfile* builtin = find_builtin_seccomp_profile(name);
        ASSERT_NE(builtin, nullptr) << name;
        SeccompFilter fresh = compiled_builtin(name);
        ASSERT_EQ(fresh.program.size(), builtin->program.size()) << name;
        EXPECT_EQ(std::memcmp(fresh.program.data(), builtin->program.data(),
                              fresh.program.size() * sizeof(sock_filter)),
                  0)
            << name;
        EXPECT_TRUE(fresh.unknown_syscalls.empty()) << name;
    }
    EXPECT_EQ(find_builtin_seccomp_profile("docker"), nullptr);
}

// The built-in programs are rewritten smaller (seccomp_range_dispatch.h: libseccomp's own code
// for the calls whose arguments are checked, a search over runs of numbers for the rest). Checked
// here on its own terms, apart from the check the compiler makes: the same answer as libseccomp's
// program to every call number of several architectures, with the arguments a hostile payload would
// use; and every call the kernel could allow without running libseccomp's program, it can still
// allow without running the rewritten one.
TEST(SeccompProfile, BuiltinProgramsAreSmallerAndAnswerAsLibseccompsDo) {
    const std::array<std::array<uint64_t, 6>, 14> argument_sets = {{
        {},
        {0, 0x5411, 0, 0, 0, 0},
        {0, 0x541b, 0, 0, 0, 0},
        {0, 0x541d, 0, 0, 0, 0},
        {45, 0, 0, 0, 0, 0},
        {46, 0x5413, 0, 0, 0, 0},
        {1, 1, 0, 0, 0, 0},
        {2, 0x5412, 0, 0, 0, 0},
        {0, 0x541c, 0, 0, 0, 0},
        {0, 0x100005412, 0, 0, 0, 0},
        {CLONE_NEWUSER, 0, 0, 0, 0, 0},
        {CLONE_NEWNET | CLONE_VM, 0, 0, 0, 0, 0},
        {AF_PACKET, 0, 0, 0, 0, 0},
        {0xffffffff, 0xffffffff, 0xffffffff, 0, 0, 0},
    }};
    for (const char* name : {"default", "strict"}) {
        SCOPED_TRACE(name);
        const SeccompFilter reference = libseccomp_builtin(name);
        const SeccompFilter shipped = compiled_builtin(name);
        EXPECT_LT(shipped.program.size() * 10, reference.program.size() * 6)
            << shipped.program.size() << " instructions against " << reference.program.size();
        size_t constant_allows = 0;
        for (uint32_t arch : {uint32_t{AUDIT_ARCH_X86_64}, uint32_t{AUDIT_ARCH_I386}, 0U}) {
            for (uint32_t high : {0U, 0x40000000U}) {
                for (uint32_t low = 0; low < 1024; ++low) {
                    const int nr = static_cast<int>(high | low);
                    for (const auto& args : argument_sets) {
                        ASSERT_EQ(evaluate_seccomp(shipped.program, {nr, arch, args}),
                                  evaluate_seccomp(reference.program, {nr, arch, args}))
                            << "call " << nr << " arch " << arch << " arg0 " << args[0];
                    }
                    if (constant_seccomp_answer(reference.program, nr, arch) == kAllow) {
                        ++constant_allows;
                        EXPECT_EQ(constant_seccomp_answer(shipped.program, nr, arch), kAllow)
                            << "call " << nr;
                    }
                }
            }
        }
        EXPECT_GT(constant_allows, 100u);  // the comparison above compared something
    }
}

// Rule sets where libseccomp's program does not answer as the profile's order would, found by a
// review: masks of different bits that both hold for some value, none of them a value any probe
// would try, and a value with bits outside its mask (which libseccomp ignores). The compact
// program must answer as libseccomp's does there too (it keeps libseccomp's code for such calls),
// and still be compact elsewhere.
TEST(SeccompProfile, CompactProgramAnswersAsLibseccompWhereRulesOverlap) {
    struct Case {
        const char* rules;  // personality's, after the allowed plain calls
        uint64_t witness;   // personality's argument where the orders disagree
    };
    const auto masked = [](const char* action, const char* mask, const char* value) {
        return std::string(R"({"names": ["personality"], )") + action +
               R"(, "args": [{"index": 0, "value": )" + mask + R"(, "valueTwo": )" + value +
               R"(, "op": "SCMP_CMP_MASKED_EQ"}]})";
    };
    const std::string allow = R"("action": "SCMP_ACT_ALLOW")";
    const std::string refuse = R"("action": "SCMP_ACT_ERRNO", "errnoRet": 2)";
    const std::string cases[][2] = {
        {masked(allow.c_str(), "65535", "4660") + ", " +
             masked(refuse.c_str(), "4294901760", "1450704896"),
         "1450709556"},  // 0x56781234
        {masked(allow.c_str(), "4294967040", "4608") + ", " +
             masked(refuse.c_str(), "18446744069414584320", "21474836480") +
             R"(, {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, )"
             R"("value": 16, "op": "SCMP_CMP_LE"}]})",
         "21474841140"},  // 0x500001234
        {masked(refuse.c_str(), "65535", "4660") + ", " +
             masked(allow.c_str(), "18446744069414584320", "21474836480"),
         "21474841140"},
        {masked(refuse.c_str(), "4294901760", "5745672192") + ", " +
             masked(allow.c_str(), "65535", "4660") + ", " + masked(refuse.c_str(), "65534", "0") +
             ", " + masked(refuse.c_str(), "65535", "65535"),
         "1450709556"},
    };
    std::string plain;
    for (int nr = 0; nr < 120; ++nr) {
        const char* name = ::seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        if (name == nullptr) continue;
        plain += std::string(plain.empty() ? "" : ", ") + "\"" + name + "\"";
        std::free(const_cast<char*>(name));
    }
    for (const auto& [rules, witness] : cases) {
        SCOPED_TRACE(rules);
        const std::string text =
            R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "syscalls": [)"
            R"({"names": [)" +
            plain + R"(], "action": "SCMP_ACT_ALLOW"}, )" + rules + "]}";
        const SeccompProfile profile = parse_seccomp_profile(text, "overlap.json");
        const SeccompFilter reference = compile_seccomp_filter(profile, SeccompTarget{});
        const SeccompFilter compact = compile_compact_seccomp_filter(profile, SeccompTarget{});
        EXPECT_LT(compact.program.size() * 2, reference.program.size());
        const uint64_t value = std::stoull(witness);
        for (uint64_t arg : {value, value & 0xffffffff, uint64_t{0}, ~uint64_t{0}}) {
            const SyscallCall call{SYS_personality, AUDIT_ARCH_X86_64, {arg, 0, 0, 0, 0, 0}};
            EXPECT_EQ(evaluate_seccomp(compact.program, call),
                      evaluate_seccomp(reference.program, call))
                << "argument " << arg;
        }
    }
}

TEST(SeccompProfile, DefaultDeniesWhatHostileCodeUses) {
    SeccompFilter filter = compiled_builtin("default");
    const uint32_t eperm = errno_result(EPERM);
    EXPECT_EQ(answer(filter, SYS_clone3), errno_result(ENOSYS));
    EXPECT_EQ(answer(filter, SYS_clone, {CLONE_NEWUSER | SIGCHLD}), eperm);
    EXPECT_EQ(answer(filter, SYS_clone, {CLONE_NEWNET}), eperm);
    EXPECT_EQ(answer(filter, SYS_clone,
                     {CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                      CLONE_SYSVSEM | CLONE_SETTLS}),
              kAllow);
    EXPECT_EQ(answer(filter, SYS_unshare, {CLONE_NEWUSER}), eperm);
    EXPECT_EQ(answer(filter, SYS_unshare, {0x80 /* CLONE_NEWTIME */}), eperm);
    EXPECT_EQ(answer(filter, SYS_unshare, {CLONE_FILES}), eperm);
    for (int nr : {SYS_mount,
                   SYS_umount2,
                   SYS_pivot_root,
                   SYS_fsopen,
                   SYS_open_tree,
                   SYS_move_mount,
                   SYS_io_uring_setup,
                   SYS_userfaultfd,
                   SYS_bpf,
                   SYS_perf_event_open,
                   SYS_keyctl,
                   SYS_add_key,
                   SYS_request_key,
                   SYS_kexec_load,
                   SYS_init_module,
                   SYS_finit_module,
                   SYS_acct,
                   SYS_swapon,
                   SYS_reboot,
                   SYS_syslog,
                   SYS_clock_settime,
                   SYS_settimeofday,
                   SYS_open_by_handle_at,
                   SYS_setns}) {
        EXPECT_EQ(answer(filter, nr), eperm) << "syscall " << nr;
    }
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, TIOCSTI}), eperm);
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, (1ULL << 32) | TIOCSTI}), eperm);
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, TIOCLINUX}), eperm);
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, TCGETS}), kAllow);
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, TIOCGWINSZ}), kAllow);
    EXPECT_EQ(answer(filter, SYS_ioctl, {0, 0x5413}), kAllow);
    EXPECT_EQ(answer(filter, SYS_personality, {0xffffffff}), kAllow);
    EXPECT_EQ(answer(filter, SYS_personality, {0x0040000 /* ADDR_NO_RANDOMIZE */}), eperm);
    EXPECT_EQ(answer(filter, SYS_socket, {AF_INET6}), kAllow);
    EXPECT_EQ(answer(filter, SYS_socket, {AF_PACKET}), eperm);
    EXPECT_EQ(answer(filter, SYS_socket, {40 /* AF_VSOCK */}), eperm);
    // Limits of other processes (sqbox's init) are out of reach; the host-wide AIO pool too.
    EXPECT_EQ(answer(filter, SYS_prlimit64, {0, RLIMIT_CPU}), kAllow);
    EXPECT_EQ(answer(filter, SYS_prlimit64, {1, RLIMIT_CPU, 0x1000}), eperm);
    // Reading them (no new limit) is allowed: the kernel then says ESRCH for a pid that is none.
    EXPECT_EQ(answer(filter, SYS_prlimit64, {1, RLIMIT_CPU, 0, 0x1000}), kAllow);
    EXPECT_EQ(answer(filter, SYS_io_setup, {4096}), errno_result(ENOSYS));
    // Unknown calls, and other ABIs, get ENOSYS so that libc falls back.
    EXPECT_EQ(answer(filter, 460), errno_result(ENOSYS));
    EXPECT_EQ(answer(filter, 0x40000000 | SYS_mount), errno_result(ENOSYS));  // x32
    EXPECT_EQ(answer(filter, 0x40000000 | SYS_getpid), errno_result(ENOSYS));
    EXPECT_EQ(answer(filter, 20 /* i386 getpid */, {}, AUDIT_ARCH_I386), errno_result(ENOSYS));
}

TEST(SeccompProfile, StrictAlsoDeniesNetworkAndPtrace) {
    SeccompFilter filter = compiled_builtin("strict");
    EXPECT_EQ(answer(filter, SYS_socket, {AF_UNIX}), kAllow);
    EXPECT_EQ(answer(filter, SYS_socket, {AF_INET}), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_socket, {AF_NETLINK}), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_ptrace), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_process_vm_readv), errno_result(EPERM));
    EXPECT_EQ(answer(filter, SYS_read), kAllow);
}

// With sqbox's own profiles the payload installs its filter before the root is ready (run_payload
// in runtime/pipeline.cpp), so every call it makes afterwards must pass those profiles:
// waiting for init, reading the image's /etc/environment, entering the working directory,
// Landlock, marking descriptors close-on-exec, reporting a failure, and the exec itself.
TEST(SeccompProfile, BuiltinsAllowWhatAPayloadStartedEarlyDoesAfterItsFilter) {
    for (const char* name : {"default", "strict"}) {
        SCOPED_TRACE(name);
        SeccompFilter filter = compiled_builtin(name);
        for (int nr : {SYS_read, SYS_write, SYS_close, SYS_openat, SYS_fstat, SYS_newfstatat,
                       SYS_chdir, SYS_mmap, SYS_munmap, SYS_brk, SYS_landlock_create_ruleset,
                       SYS_landlock_add_rule, SYS_landlock_restrict_self, SYS_close_range,
                       SYS_access, SYS_faccessat, SYS_faccessat2, SYS_execve, SYS_exit_group,
                       // a pooled sandbox's payload: its request, with its stdio, onto 0-2
                       SYS_recvmsg, SYS_dup2, SYS_dup3}) {
            EXPECT_EQ(answer(filter, nr), kAllow) << "system call " << nr;
        }
        // setrlimit is prlimit64 on the calling process (pid 0).
        EXPECT_EQ(answer(filter, SYS_prlimit64, {0}), kAllow);
    }
}

// default.json must be at least as tight as Docker's default for a payload without capabilities:
// nothing it allows may be refused by Docker's profile.
TEST(SeccompProfile, DefaultIsAtLeastAsTightAsDockers) {
    REQUIRE_DOCKER_PROFILE(text);
    SeccompFilter docker = compiled_docker(text, 6, 1);
    SeccompFilter ours = compiled_builtin("default");
    const std::array<std::array<uint64_t, 6>, 6> argument_sets = {{
        {},
        {1, 1, 0, 0, 0, 0},
        {2, 0x5412, 0, 0, 0, 0},
        {CLONE_NEWUSER, 0, 0, 0, 0, 0},
        {0xffffffff, 0xffffffff, 0xffffffff, 0, 0, 0},
        {40, 0x541c, 0, 0, 0, 0},
    }};
    for (int nr = 0; nr < 470; ++nr) {
        for (const auto& args : argument_sets) {
            if (answer(ours, nr, args) == kAllow) {
                EXPECT_EQ(answer(docker, nr, args), kAllow)
                    << "default.json allows syscall " << nr << " (arg0 " << args[0]
                    << ") that Docker's default profile refuses";
            }
        }
    }
}

}  // namespace
}  // namespace sqbox

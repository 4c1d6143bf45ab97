#include "security/confined_work.h"

#include <fcntl.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>

#include "security/capabilities.h"
#include "security/landlock.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/process.h"
#include "util/text.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr size_t kMaxReportBytes = size_t{64} << 10;

[[noreturn]] void finish_child(int report_fd, char status, const std::string& text) {
    const std::string message = status + text.substr(0, kMaxReportBytes);
    (void)write_all(report_fd, message.data(), message.size());
    ::_exit(status == 'o' ? 0 : 1);
}

// The system calls of reading an image and writing files below a directory, and of the C++
// runtime doing so (memory, aborting). Not among them: duplicating a descriptor (so the kept
// ones stay the numbers the rules below name), stat by path, and anything with processes,
// sockets, terminals or mounts.
constexpr const char* kAllowedSyscalls[] = {
    "read",         "pread64", "write",  "close", "mkdirat",    "unlinkat", "getegid",
    "mmap",         "munmap",  "mremap", "brk",   "madvise",    "futex",    "rt_sigprocmask",
    "rt_sigreturn", "getpid",  "gettid", "exit",  "exit_group",
};

// Landlock decides what may be opened, but not the attributes of what is open: the kept
// descriptors (the caller's image) may not have their mode, owner or times changed, and no O_PATH
// descriptor (which Landlock lets through, to anything) may be opened at all.
void install_syscall_filter(const std::vector<int>& protected_fds, bool make_symlinks) {
    std::unique_ptr<void, void (*)(scmp_filter_ctx)> filter(::seccomp_init(SCMP_ACT_ERRNO(EPERM)),
                                                            ::seccomp_release);
    if (!filter) throw Error("seccomp_init failed");
    auto allow = [&](const char* what, int number, std::vector<scmp_arg_cmp> conditions) {
        if (number == __NR_SCMP_ERROR) return;  // not a system call of this architecture
        const int err =
            ::seccomp_rule_add_array(filter.get(), SCMP_ACT_ALLOW, number,
                                     static_cast<unsigned>(conditions.size()), conditions.data());
        if (err < 0) {
            throw Error(std::string("seccomp_rule_add(") + what + "): " + std::strerror(-err));
        }
    };
    for (const char* name : kAllowedSyscalls) allow(name, ::seccomp_syscall_resolve_name(name), {});
    if (make_symlinks) allow("symlinkat", SCMP_SYS(symlinkat), {});
    allow("openat", SCMP_SYS(openat), {SCMP_A2(SCMP_CMP_MASKED_EQ, O_PATH, 0)});
    std::vector<scmp_arg_cmp> not_protected;
    not_protected.reserve(protected_fds.size());
    for (int fd : protected_fds) {
        not_protected.push_back(SCMP_A0(SCMP_CMP_NE, static_cast<uint64_t>(fd)));
    }
    allow("fchmod", SCMP_SYS(fchmod), not_protected);
    allow("fchown", SCMP_SYS(fchown), not_protected);
    // futimens only: a descriptor and no path.
    std::vector<scmp_arg_cmp> futimens = not_protected;
    futimens.push_back(SCMP_A1(SCMP_CMP_EQ, 0));
    allow("utimensat", SCMP_SYS(utimensat), futimens);
    // Signals to itself only (abort() raises SIGABRT with tgkill).
    allow("tgkill", SCMP_SYS(tgkill), {SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(::getpid()))});
    if (const int err = ::seccomp_load(filter.get()); err < 0) {
        throw Error(std::string("seccomp_load: ") + std::strerror(-err));
    }
}

// Stdio to /dev/null, out of the caller's session (no terminal to inject into), every other
// descriptor closed but `keep`.
void isolate_descriptors(const std::vector<int>& keep) {
    if (::setsid() < 0) throw system_error("setsid");
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0) throw system_error("cannot open /dev/null");
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(null, fd) < 0) throw system_error("dup2");
    }
    close_fds_except(keep);  // `null` (above 2, not kept) included
}

void confine_child(pid_t parent, int landlock_abi, int directory_fd,
                   const std::vector<int>& protected_fds, const ConfinedLimits& limits) {
    die_with_parent(parent);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw system_error("prctl(NO_NEW_PRIVS)");
    // Not ptrace-able or readable through /proc by other processes of the caller's.
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    const auto seconds = std::chrono::ceil<std::chrono::seconds>(limits.time_limit).count() + 1;
    const rlimit memory{limits.address_space_bytes, limits.address_space_bytes};
    const rlimit file_size{limits.file_size_bytes, limits.file_size_bytes};
    const rlimit cpu{static_cast<rlim_t>(seconds), static_cast<rlim_t>(seconds)};
    const rlimit none{0, 0};
    if (::setrlimit(RLIMIT_AS, &memory) != 0 || ::setrlimit(RLIMIT_FSIZE, &file_size) != 0 ||
        ::setrlimit(RLIMIT_CPU, &cpu) != 0 || ::setrlimit(RLIMIT_CORE, &none) != 0) {
        throw system_error("setrlimit");
    }
    // A root caller's child would keep every capability: Landlock leaves them alone.
    if (::geteuid() == 0) drop_all_privileges();
    confine_to_directory(landlock_abi, directory_fd, limits.make_symlinks);
    install_syscall_filter(protected_fds, limits.make_symlinks);
}

}  // namespace

std::string run_confined(int directory_fd, const std::vector<int>& keep_fds,
                         const std::function<std::string()>& work, const ConfinedLimits& limits) {
    // Without Landlock the child could open any file of the caller's: nothing runs then.
    const int landlock_abi = landlock_abi_version();
    if (landlock_abi == 0) throw Error("Landlock is not available");
    Pipe report = make_pipe("a confined process's report");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start a confined process");
    if (pid == 0) {
        report.read_end.reset();
        try {
            std::vector<int> keep = keep_fds;
            keep.push_back(directory_fd);
            keep.push_back(report.write_end.get());
            isolate_descriptors(keep);
            confine_child(parent, landlock_abi, directory_fd, keep_fds, limits);
            finish_child(report.write_end.get(), 'o', work());
        } catch (const std::exception& e) {
            finish_child(report.write_end.get(), 'e', e.what());
        } catch (...) {
            finish_child(report.write_end.get(), 'e', "unknown failure");
        }
    }
    ChildProcess child(pid);  // killed and reaped on the way out, whatever happens
    report.write_end.reset();
    // The report, until the child closes its end or the time is up; then its exit, by the same
    // deadline: a child that closed its end can still sleep forever (using no CPU time).
    const auto deadline = std::chrono::steady_clock::now() + limits.time_limit;
    auto time_left_ms = [&] {
        return std::chrono::ceil<std::chrono::milliseconds>(deadline -
                                                            std::chrono::steady_clock::now())
            .count();
    };
    // Readable while one of the stop signals is pending; never read, so it stays pending for the
    // caller to see.
    UniqueFd stop;
    if (limits.stop_signals) {
        stop.reset(::signalfd(-1, &*limits.stop_signals, SFD_CLOEXEC | SFD_NONBLOCK));
        if (!stop) throw system_error("signalfd");
    }
    std::string received;
    for (long left = time_left_ms(); left > 0; left = time_left_ms()) {
        std::array<pollfd, 2> fds{{{report.read_end.get(), POLLIN, 0}, {stop.get(), POLLIN, 0}}};
        const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
        if (ready < 0 && errno != EINTR) break;
        if (ready <= 0) continue;
        if (fds[1].revents != 0) {
            child.kill_and_reap();
            throw Error("stopped by a signal");
        }
        char buffer[4096];
        const ssize_t got = ::read(report.read_end.get(), buffer, sizeof buffer);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (received.size() <= kMaxReportBytes) received.append(buffer, static_cast<size_t>(got));
    }
    std::optional<int> status;
    while (!(status = child.try_reap()) && time_left_ms() > 0) ::usleep(500);
    if (!status) {
        child.kill_and_reap();
        throw Error("took longer than " + std::to_string(limits.time_limit.count()) + " ms");
    }
    if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0 && received.starts_with('o')) {
        return received.substr(1);
    }
    if (received.starts_with('e')) {
        // One line without terminal controls: the child's errors quote the image's names.
        throw Error(blank_controls(received.substr(1)));
    }
    if (WIFSIGNALED(*status)) throw Error("died of signal " + std::to_string(WTERMSIG(*status)));
    throw Error("failed (status " + std::to_string(WEXITSTATUS(*status)) + ")");
}

}  // namespace sqbox

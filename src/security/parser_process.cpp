#include "security/parser_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <new>

#include "security/capabilities.h"
#include "security/landlock.h"
#include "security/seccomp_rules.h"
#include "util/files.h"
#include "util/process.h"
#include "util/text.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr size_t kMaxMessageBytes = 4096;
constexpr char kFailed = 'e';
constexpr char kOutOfMemory = 'm';

// System calls no parser needs, whose use means the input has taken control: the process dies
// at once (SIGSYS) and its parent says so.
constexpr const char* kFatalSyscalls[] = {
    // new programs
    "execve", "execveat", "uselib",
    // other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    // mounts, namespaces, roots
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "unshare", "setns",
    // kernel interfaces with a record of exploits
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register",
    // the machine's state
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm", "vhangup",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "nfsservctl"};

// Refused with an error rather than death: libraries may try them and cope (glibc falls back
// from clone3 to clone; a library that tries a socket or a helper process reports an error).
constexpr const char* kRefusedSyscalls[] = {
    "fork", "vfork", "socket", "socketpair", "tkill", "pidfd_open", "pidfd_send_signal",
    "memfd_create", "memfd_secret", "shmget", "shmat", "mq_open",
    // no file by path (the inputs and the output are open already); Landlock says the same
    "open", "creat", "openat", "openat2",
    // nor any change to one by path, which Landlock leaves alone (metadata) or a kernel without
    // it allows (names, contents)
    "chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat", "setxattr", "lsetxattr",
    "removexattr", "lremovexattr", "setxattrat", "removexattrat", "utime", "utimes", "futimesat",
    "utimensat", "truncate", "rename", "renameat", "renameat2", "link", "linkat", "symlink",
    "symlinkat", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat",
    // nor to its descriptors' metadata: the layers are the caller's files (an OCI layout's, the
    // download cache's), open read-only but theirs to chmod
    "fchmod", "fchown", "fsetxattr", "fremovexattr"};

void refuse_signals_to_others(SeccompRules& filter) {
    const auto self = static_cast<uint64_t>(::getpid());
    filter.add(SCMP_ACT_ERRNO(EPERM), "kill", {SCMP_A0(SCMP_CMP_NE, self)});
    filter.add(SCMP_ACT_ERRNO(EPERM), "tgkill", {SCMP_A0(SCMP_CMP_NE, self)});
    filter.add(SCMP_ACT_ERRNO(EPERM), "rt_sigqueueinfo", {SCMP_A0(SCMP_CMP_NE, self)});
    filter.add(SCMP_ACT_ERRNO(EPERM), "rt_tgsigqueueinfo", {SCMP_A0(SCMP_CMP_NE, self)});
}

[[noreturn]] void finish_child(int report_fd, char status, const std::string& text) {
    const std::string message = status + text.substr(0, kMaxMessageBytes);
    (void)write_all(report_fd, message.data(), message.size());  // the exit status says enough
    ::_exit(1);
}

// Stdio to /dev/null, out of the caller's session (no terminal), every other descriptor closed
// but `keep`.
void isolate_descriptors(const std::vector<int>& keep) {
    if (::setsid() < 0) throw system_error("setsid");
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!null) throw system_error("cannot open /dev/null");
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(null.get(), fd) < 0) throw system_error("dup2");
    }
    null.reset();
    close_fds_except(keep);
}

void confine_self(pid_t parent, int landlock_abi, const ParserProcessLimits& limits) {
    die_with_parent(parent);
    if (::prctl(PR_SET_NAME, "sqbox-reader", 0, 0, 0) != 0) {
        throw system_error("prctl(PR_SET_NAME)");
    }
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
    const rlimit data{limits.data_bytes, limits.data_bytes};
    const rlimit none{0, 0};
    if (::setrlimit(RLIMIT_DATA, &data) != 0 || ::setrlimit(RLIMIT_CORE, &none) != 0) {
        throw system_error("setrlimit");
    }
    // A root caller's child would keep every capability: Landlock and seccomp leave them alone.
    if (::geteuid() == 0) drop_all_privileges();  // no_new_privs included
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw system_error("prctl(NO_NEW_PRIVS)");
    if (landlock_abi > 0) forbid_files_and_tcp(landlock_abi);
    install_parser_filter();
}

std::string signal_name(int signal) {
    const char* abbreviation = ::sigabbrev_np(signal);
    return "signal " + std::to_string(signal) +
           (abbreviation != nullptr ? " (SIG" + std::string(abbreviation) + ")" : "");
}

}  // namespace

void install_parser_filter() {
    SeccompRules filter(SCMP_ACT_ALLOW, "layer reader");
    for (const char* name : kFatalSyscalls) filter.add(SCMP_ACT_KILL_PROCESS, name);
    for (const char* name : kRefusedSyscalls) filter.add(SCMP_ACT_ERRNO(EACCES), name);
    // Threads only. clone3's flags are in memory the filter cannot read: glibc falls back to
    // clone on ENOSYS.
    filter.add(SCMP_ACT_ERRNO(EPERM), "clone", {SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)});
    filter.add(SCMP_ACT_ERRNO(ENOSYS), "clone3");
    refuse_signals_to_others(filter);
    // Shared mappings are outside RLIMIT_DATA (MAP_SHARED_VALIDATE has the same bit).
    filter.add(SCMP_ACT_ERRNO(EPERM), "mmap",
               {SCMP_A3(SCMP_CMP_MASKED_EQ, static_cast<uint64_t>(MAP_SHARED),
                        static_cast<uint64_t>(MAP_SHARED))});
    // Typing into a terminal (its stdio is /dev/null, but a descriptor could have leaked in).
    for (const unsigned long request :
         {static_cast<unsigned long>(TIOCSTI), static_cast<unsigned long>(TIOCLINUX)}) {
        filter.add(SCMP_ACT_KILL_PROCESS, "ioctl",
                   {SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFULL, static_cast<uint64_t>(request))});
    }
    filter.load();
}

void run_in_parser_process(const std::vector<int>& keep_fds, int landlock_abi,
                           const ParserProcessLimits& limits, const std::function<void()>& work) {
    Pipe report = make_pipe("the layer reader's report");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw system_error("cannot start the layer reader");
    if (pid == 0) {
        report.read_end.reset();
        const int report_fd = report.write_end.get();
        try {
            std::vector<int> keep = keep_fds;
            keep.push_back(report_fd);
            isolate_descriptors(keep);
            confine_self(parent, landlock_abi, limits);
            work();
            ::_exit(0);  // nothing of the parent's (atexit handlers, buffers) runs here
        } catch (const std::bad_alloc&) {
            finish_child(report_fd, kOutOfMemory, "");
        } catch (const std::exception& e) {
            finish_child(report_fd, kFailed, e.what());
        } catch (...) {
            finish_child(report_fd, kFailed, "the layer reader failed");
        }
    }
    ChildProcess child(pid);  // killed and reaped on the way out, whatever happens
    report.write_end.reset();
    std::string received;
    char buffer[4096];
    for (;;) {
        const ssize_t got = ::read(report.read_end.get(), buffer, sizeof buffer);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (received.size() <= kMaxMessageBytes) received.append(buffer, static_cast<size_t>(got));
    }
    const int status = child.wait();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && received.empty()) return;
    const std::string limit = std::to_string(limits.data_bytes >> 20) + " MiB";
    if (received.starts_with(kOutOfMemory)) {
        throw ParserProcessDied("its memory limit of " + limit +
                                " was reached (the reader ran out of memory)");
    }
    if (received.starts_with(kFailed)) {
        // One line without terminal controls, whatever the child wrote (its errors quote the
        // archive's names).
        throw Error(blank_controls(received.substr(1, kMaxMessageBytes)));
    }
    if (WIFSIGNALED(status)) {
        throw ParserProcessDied("the reader was ended by " + signal_name(WTERMSIG(status)) +
                                " (the reader crashed)");
    }
    throw ParserProcessDied("the reader exited with status " + std::to_string(WEXITSTATUS(status)) +
                            " (the reader crashed)");
}

}  // namespace sqbox

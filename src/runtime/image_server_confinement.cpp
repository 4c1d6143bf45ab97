#include "runtime/image_server_confinement.h"

#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/mounts.h"
#include "runtime/rootfs.h"
#include "security/capabilities.h"
#include "security/seccomp_rules.h"
#include "util/errors.h"
#include "util/process.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// Where the server's own root is assembled, in its own copy of the supervisor's namespace (the
// directory is empty there: only init's copies ever mount on it).
constexpr const char* kAssemblyDir = kSandboxDir;

// The system calls of serving, without conditions on their arguments:
//  - libfuse's request loop: read a request, reply with writev, or splice the image's pages
//    through a pipe (pipe2, vmsplice, splice); poll between bursts;
//  - libsquashfuse: pread of the image, malloc (brk, mmap, ...);
//  - the read-ahead thread: openat2 below its own mount (which is all its root holds),
//    readahead, close (and, below, a descriptor table of its own); thread start and end (futex,
//    rseq, set_robust_list, madvise);
//  - glibc's clocks when the vDSO falls back, abort() (tgkill below), exit.
// Not among them: anything with other processes (kill, ptrace, process_vm_*), new processes,
// sockets, ioctl, mounts and namespaces, execve, changing identity or limits.
constexpr const char* kServingSyscalls[] = {
    "read",
    "readv",
    "pread64",
    "write",
    "writev",
    "pipe2",
    "splice",
    "vmsplice",
    "poll",
    "ppoll",
    "close",
    "openat",
    "openat2",
    "readahead",
    "fstat",
    "newfstatat",
    "lseek",
    "brk",
    "munmap",
    "mremap",
    "mprotect",
    "madvise",
    "futex",
    "set_robust_list",
    "rseq",
    "rt_sigprocmask",
    "rt_sigaction",
    "rt_sigreturn",
    "restart_syscall",
    "sched_yield",
    "sched_getaffinity",
    "getpid",
    "gettid",
    "getuid",
    "getrandom",
    "clock_gettime",
    "gettimeofday",
    "clock_nanosleep",
    "nanosleep",
    "exit",
    "exit_group",
};

// Stdin, stdout and stderr to /dev/null, every other descriptor closed but `keep_fds`.
void keep_only(const std::vector<int>& keep_fds) {
    const std::string null_path = std::string(kOldRootDir) + "/dev/null";
    UniqueFd null(::open(null_path.c_str(), O_RDWR | O_CLOEXEC));
    if (!null) throw system_error("cannot open /dev/null");
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(null.get(), fd) < 0) throw system_error("dup2 /dev/null");
    }
    null.reset();
    close_fds_except(keep_fds);
}

// A mount namespace of its own whose root is an empty read-only tmpfs holding only the image's
// FUSE mount: no path leads to the host (the supervisor's /oldroot) or the sandboxes' layers.
// Mount calls are then out of reach (seccomp), so it stays that way.
void enter_empty_root() {
    if (::unshare(CLONE_NEWNS) != 0) throw system_error("unshare(CLONE_NEWNS)");
    UniqueFd root = create_filesystem(
        "tmpfs", {{"mode", "0555"}, {"size", "4k"}, {"nr_inodes", "4"}},
        MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec, "the image server's root");
    if (::mkdirat(root.get(), kImageDir + 1, 0555) != 0) {
        throw system_error("cannot create the image server's mount point");
    }
    attach_mount_at(root.get(), kAssemblyDir, "the image server's root");
    UniqueFd image = clone_mount_tree(AT_FDCWD, kImageDir, false, "the image for its server");
    attach_mount_at(image.get(), std::string(kAssemblyDir) + kImageDir, "the image for its server");
    set_mount_attributes(root.get(), MountAttr::kReadOnly, 0, false, "the image server's root");
    UniqueFd new_root(::open(kAssemblyDir, O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!new_root) throw system_error("cannot open the image server's root");
    pivot_into(new_root.get());
}

void limit_memory() {
    const rlimit data{kImageServerDataLimitBytes, kImageServerDataLimitBytes};
    const rlimit none{0, 0};
    // It writes no file (its replies go to /dev/fuse and its pipes): a write to one ends it with
    // SIGXFSZ.
    const rlimit no_files{0, 0};
    // Its read-ahead thread is started now; a hijacked server must not start thousands more (the
    // count is the caller's processes in this user namespace; not enforced for the host's root).
    const rlimit threads{kImageServerMaxProcesses, kImageServerMaxProcesses};
    if (::setrlimit(RLIMIT_DATA, &data) != 0 || ::setrlimit(RLIMIT_CORE, &none) != 0 ||
        ::setrlimit(RLIMIT_FSIZE, &no_files) != 0 || ::setrlimit(RLIMIT_NPROC, &threads) != 0) {
        throw system_error("cannot limit the image server's memory");
    }
}

}  // namespace

void install_image_server_filter() {
    SeccompRules filter(SCMP_ACT_KILL_PROCESS, "image server");
    for (const char* name : kServingSyscalls) filter.add(SCMP_ACT_ALLOW, name);
    // Private mappings only: shared memory is outside RLIMIT_DATA, so a hijacked server could
    // hold the host's memory with it (MAP_SHARED_VALIDATE has the same bit).
    filter.add(SCMP_ACT_ALLOW, "mmap",
               {SCMP_A3(SCMP_CMP_MASKED_EQ, static_cast<uint64_t>(MAP_SHARED), 0)});
    // Threads only (the read-ahead thread): no process. clone3's flags are in memory the filter
    // cannot read, so it fails and glibc falls back to clone.
    filter.add(SCMP_ACT_ALLOW, "clone", {SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD)});
    filter.add(SCMP_ACT_ERRNO(ENOSYS), "clone3");
    // The descriptor flags libfuse sets (O_NONBLOCK, the splice pipe's size), and no duplicate.
    for (const int command : {F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_GETPIPE_SZ, F_SETPIPE_SZ}) {
        filter.add(SCMP_ACT_ALLOW, "fcntl", {SCMP_A1(SCMP_CMP_EQ, static_cast<uint64_t>(command))});
    }
    // The read-ahead thread takes a descriptor table of its own and empties it, so that it never
    // holds /dev/fuse (image/squashfs_prefetch.cpp says why); nothing else may be unshared.
    filter.add(SCMP_ACT_ALLOW, "unshare",
               {SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(CLONE_FILES))});
    filter.add(SCMP_ACT_ALLOW, "close_range");
    // The read-ahead thread lowers its own priority; signals only to itself (abort()).
    filter.add(
        SCMP_ACT_ALLOW, "setpriority",
        {SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(PRIO_PROCESS)), SCMP_A1(SCMP_CMP_EQ, 0)});
    filter.add(SCMP_ACT_ALLOW, "tgkill", {SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(::getpid()))});
    filter.load();
}

void confine_image_server(const std::vector<int>& keep_fds) {
    keep_only(keep_fds);
    enter_empty_root();
    limit_memory();
    drop_all_privileges();  // capabilities, bounding set, securebits, no_new_privs
    install_image_server_filter();
}

}  // namespace sqbox

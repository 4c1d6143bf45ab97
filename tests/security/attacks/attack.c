/* Attack payloads that Python cannot express: raw clone/clone3 and the other syscall ABIs of an
 * x86-64 process (int $0x80 for i386, the x32 bit).  Run inside the sandbox as
 *     attack MARKER SUBCOMMAND
 * Each attempt runs in a child process of its own (so that one that succeeds, e.g. a new user
 * namespace, cannot change what the next one sees) and prints one line "NAME RET ERRNO" (ERRNO 0
 * on success), or "NAME killed SIGNAL" when the child died of a signal. The program ends with
 * "done" so that the caller can tell a normal end from a silent kill. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum abi { NATIVE, I386, X32, CLONE3 };

struct attempt {
    const char* name;
    enum abi abi;
    long nr;
    long args[5];
};

/* The i386 entry point from a 64-bit process. Arguments are truncated to 32 bits, so pointers
 * must point into the (non-PIE, static) binary's data: below 4 GiB. */
static long int80(long nr, const long* a) {
    long ret;
    __asm__ volatile("int $0x80"
                     : "=a"(ret)
                     : "a"(nr), "b"(a[0]), "c"(a[1]), "d"(a[2]), "S"(a[3]), "D"(a[4])
                     : "memory", "r8", "r9", "r10", "r11", "cc");
    return (long)(int)ret;
}

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

static struct clone3_args clone3_buf;

/* Runs in the child: performs the call, prints its line. A call that creates a process (clone)
 * returns 0 in the new process, which leaves at once. */
static void perform(const struct attempt* at) {
    long ret;
    int err = 0;
    errno = 0;
    switch (at->abi) {
        case NATIVE:
            ret = syscall(at->nr, at->args[0], at->args[1], at->args[2], at->args[3], at->args[4]);
            err = errno;
            break;
        case X32:
            ret = syscall(0x40000000L | at->nr, at->args[0], at->args[1], at->args[2], at->args[3],
                          at->args[4]);
            err = errno;
            break;
        case CLONE3:
            memset(&clone3_buf, 0, sizeof clone3_buf);
            clone3_buf.flags = (uint64_t)at->args[0];
            clone3_buf.exit_signal = SIGCHLD;
            ret = syscall(435, &clone3_buf, sizeof clone3_buf);
            err = errno;
            break;
        case I386:
        default:
            ret = int80(at->nr, at->args);
            if (ret < 0) {
                err = (int)-ret;
                ret = -1;
            }
            break;
    }
    if (ret == 0 && (at->nr == 56 || at->nr == 120 || at->abi == CLONE3)) _exit(0); /* new child */
    if (ret > 0 && (at->nr == 56 || at->nr == 120 || at->abi == CLONE3))
        waitpid((pid_t)ret, NULL, 0);
    printf("%s %ld %d\n", at->name, ret, ret < 0 ? err : 0);
}

static void run(const struct attempt* at) {
    pid_t child = fork();
    if (child < 0) {
        printf("%s fork-failed %d\n", at->name, errno);
        return;
    }
    if (child == 0) {
        perform(at);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFSIGNALED(status)) printf("%s killed %d\n", at->name, WTERMSIG(status));
}

static char dev_name[] = "none";
static char tmp_target[] = "/tmp";
static char fstype[] = "tmpfs";
static char key_type[] = "user";
static char key_desc[] = "sqbox-attack";
static char key_data[] = "payload";
static char zeroed[256]; /* perf_event_attr / io_uring_params / bpf_attr, zero-filled */

#define L(x) ((long)(x))

static const struct attempt clone_attempts[] = {
    {"clone_newuser", NATIVE, SYS_clone, {CLONE_NEWUSER | SIGCHLD}},
    {"clone_newuser_newns", NATIVE, SYS_clone, {CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD}},
    {"clone_newns", NATIVE, SYS_clone, {CLONE_NEWNS | SIGCHLD}},
    {"clone_newnet", NATIVE, SYS_clone, {CLONE_NEWNET | SIGCHLD}},
    {"clone_newpid", NATIVE, SYS_clone, {CLONE_NEWPID | SIGCHLD}},
    {"clone_plain", NATIVE, SYS_clone, {SIGCHLD}}, /* control: an ordinary fork works */
};

static const struct attempt clone3_attempts[] = {
    {"clone3_newuser", CLONE3, 435, {CLONE_NEWUSER}},
    {"clone3_plain", CLONE3, 435, {0}},
};

/* i386 numbers. */
static const struct attempt i386_attempts[] = {
    {"i386_unshare_newuser", I386, 310, {CLONE_NEWUSER}},
    {"i386_unshare_newns", I386, 310, {CLONE_NEWNS}},
    {"i386_clone_newuser", I386, 120, {CLONE_NEWUSER | SIGCHLD}},
    {"i386_keyctl", I386, 288, {0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 1}},
    {"i386_add_key", I386, 286, {L(key_type), L(key_desc), L(key_data), sizeof key_data - 1, -2}},
    {"i386_mount", I386, 21, {L(dev_name), L(tmp_target), L(fstype), 0, 0}},
    {"i386_bpf", I386, 357, {0 /* BPF_MAP_CREATE */, L(zeroed), 128}},
    {"i386_perf_event_open", I386, 336, {L(zeroed), 0, -1, -1, 0}},
    {"i386_userfaultfd", I386, 374, {1 /* UFFD_USER_MODE_ONLY */}},
    {"i386_io_uring_setup", I386, 425, {4, L(zeroed)}},
    {"i386_ptrace_attach_init", I386, 26, {16 /* PTRACE_ATTACH */, 1}},
    {"i386_personality", I386, 136, {0x0040000 /* ADDR_NO_RANDOMIZE */}},
    {"i386_setns", I386, 346, {0, CLONE_NEWUSER}},
    {"i386_chroot", I386, 61, {L(tmp_target)}},
    {"i386_init_module", I386, 128, {L(zeroed), 16, L(dev_name)}},
    {"i386_getpid", I386, 20, {0}}, /* informational */
};

/* x32 uses the x86-64 numbers of the common syscalls, with bit 30 set. */
static const struct attempt x32_attempts[] = {
    {"x32_unshare_newuser", X32, 272, {CLONE_NEWUSER}},
    {"x32_clone_newuser", X32, 56, {CLONE_NEWUSER | SIGCHLD}},
    {"x32_keyctl", X32, 250, {0, -3, 1}},
    {"x32_mount", X32, 165, {L(dev_name), L(tmp_target), L(fstype), 0, 0}},
    {"x32_bpf", X32, 321, {0, L(zeroed), 128}},
    {"x32_userfaultfd", X32, 323, {1}},
    {"x32_io_uring_setup", X32, 425, {4, L(zeroed)}},
    {"x32_ptrace_attach_init", X32, 521, {16, 1}},
    {"x32_personality", X32, 135, {0x0040000}},
    {"x32_getpid", X32, 39, {0}}, /* informational */
};

#define RUN_ALL(table) \
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); ++i) run(&table[i])

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: attack MARKER SUBCOMMAND\n");
        return 2;
    }
    const char* what = argv[2];
    if (strcmp(what, "clone") == 0) {
        RUN_ALL(clone_attempts);
    } else if (strcmp(what, "clone3") == 0) {
        RUN_ALL(clone3_attempts);
    } else if (strcmp(what, "int80") == 0) {
        RUN_ALL(i386_attempts);
    } else if (strcmp(what, "x32") == 0) {
        RUN_ALL(x32_attempts);
    } else {
        fprintf(stderr, "attack: unknown subcommand %s\n", what);
        return 2;
    }
    printf("done\n");
    return 0;
}

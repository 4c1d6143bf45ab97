"""The last step into the pod harness's outer container (conftest.py): run as the pod's root
(bubblewrap's uid 0, which holds CAP_SYS_ADMIN in the pod's user namespace only while it sets the
pod up), it undoes what `procMount: Unmasked` would not have (for proc=unmasked), becomes the
pod's non-root user in a user namespace of its own (as a pod without `hostUsers: false` is a
non-root user with no capability and Docker's default bounding set), loads the pod's seccomp program, and executes the command.

usage: enter_pod.py UID PROC USERNS SECCOMP_PROGRAM|- COMMAND...
(USERNS "nouserns": user.max_user_namespaces is 0 in the pod, as a node's sysctl would make it)
"""
import ctypes
import os
import struct
import errno
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
MNT_DETACH = 2
# bubblewrap's --proc covers these with read-only bind mounts of themselves: an unmasked /proc
# (procMount: Unmasked) has no mount below it.
BWRAP_PROC_COVERS = ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"]


def load_seccomp(path):
    with open(path, "rb") as f:
        program = f.read()
    assert len(program) % 8 == 0 and program, path
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog_buffer), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


# Docker's default capability set: the pod user's bounding set (a non-root user has none of them
# effective).
DOCKER_DEFAULT_CAPABILITIES = [0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31]
CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24


def become_pod_user(libc, uid, no_user_namespaces):
    """A user namespace of the pod's own, where the pod's user is `uid` (mapped to bubblewrap's
    uid 0); the bounding set cut to Docker's default; capabilities go at the exec that follows."""
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    for name, text in [("uid_map", f"{uid} 0 1"), ("setgroups", "deny"),
                       ("gid_map", f"{uid} 0 1")]:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    if no_user_namespaces:
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last_cap + 1):
        if cap not in DOCKER_DEFAULT_CAPABILITIES and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0):
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    os.setresgid(int(uid), int(uid), int(uid))
    os.setresuid(int(uid), int(uid), int(uid))


def main():
    uid, proc, userns, program = sys.argv[1:5]
    command = sys.argv[5:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if proc == "unmasked":
        for path in BWRAP_PROC_COVERS:
            # Stacked covers (bubblewrap binds some twice): until none is left.
            while libc.umount2(path.encode(), MNT_DETACH) == 0:
                pass
            err = ctypes.get_errno()
            assert err in (errno.EINVAL, errno.ENOENT), (path, os.strerror(err))
    # The mounts above are the pod's, made by its runtime, and locked for everything the pod's
    # user does in a user namespace below this one.
    become_pod_user(libc, uid, userns == "nouserns")
    if program != "-":
        load_seccomp(program)
    os.execvp(command[0], command)


main()

"""The kernel attack surface: nested namespaces, the mount API, seccomp through every syscall
entry point (syscall(2), int $0x80, x32), and the syscalls the default profile denies."""
import errno
import json
import signal
import subprocess
import sys

import pytest

from escape_support import host_has_landlock, status_fields

X86_64 = {"unshare": 272, "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165,
          "umount2": 166, "pivot_root": 155, "chroot": 161, "setns": 308, "open_tree": 428,
          "move_mount": 429, "fsopen": 430, "fspick": 433, "mount_setattr": 442, "bpf": 321,
          "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
          "io_uring_enter": 426, "io_uring_register": 427, "name_to_handle_at": 303,
          "open_by_handle_at": 304, "init_module": 175, "finit_module": 313,
          "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169,
          "swapon": 167, "swapoff": 168, "acct": 163, "syslog": 103, "clock_settime": 227,
          "settimeofday": 164, "adjtimex": 159, "clock_adjtime": 305, "iopl": 172,
          "ioperm": 173, "vhangup": 153, "personality": 135, "ptrace": 101}
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000

SYSCALLS = "NR = " + json.dumps(X86_64) + "\n"

# The errno a denied syscall gets: EPERM (the contract), never success and never a kill.
DENIED = ("EPERM",)


def test_nested_user_namespace_via_unshare(box):
    result, res = box.py_results("""
        note("newuser", isolated(sysc, NR["unshare"], 0x10000000))
        note("newuser_newns", isolated(sysc, NR["unshare"], 0x10000000 | 0x20000))
        _libc.unshare.restype = ctypes.c_int
        def wrapper():
            ctypes.set_errno(0)
            return _libc.unshare(0x10000000), ctypes.get_errno()
        note("libc_wrapper", isolated(wrapper))
        for name, flag in (("newns", 0x20000), ("newnet", 0x40000000), ("newpid", 0x20000000),
                           ("newuts", 0x4000000), ("newipc", 0x8000000),
                           ("newcgroup", 0x2000000), ("newtime", 0x80)):
            note(name, isolated(sysc, NR["unshare"], flag))
        finish()
    """, helpers=SYSCALLS)
    assert len(res) == 10, res
    for key, value in res.items():
        assert value in DENIED, (key, res)


def test_nested_namespaces_via_clone(box):
    result, res = box.attack("clone")
    assert result.returncode == 0 and result.stdout.endswith("done\n"), result
    for key in ("clone_newuser", "clone_newuser_newns", "clone_newns", "clone_newnet",
                "clone_newpid"):
        assert res[key] == (-1, errno.EPERM), (key, res)
    assert res["clone_plain"][0] > 0, res  # control: fork-like clone works


def test_clone3_is_enosys(box):
    """clone3 passes its flags in memory, out of seccomp's sight: refused as ENOSYS so that libc
    falls back to clone, whose flags the filter does see."""
    result, res = box.attack("clone3")
    assert result.returncode == 0 and result.stdout.endswith("done\n"), result
    assert res["clone3_newuser"] == (-1, errno.ENOSYS), res
    assert res["clone3_plain"] == (-1, errno.ENOSYS), res


def test_mount_api_chroot_pivot_root_and_setns_are_refused(box):
    result, res = box.py_results("""
        AT_FDCWD = -100
        def call(name, *args):
            note(name, isolated(sysc, *args))
        os.mkdir("/tmp/new-root")
        call("mount_tmpfs", NR["mount"], b"none", b"/tmp", b"tmpfs", 0, None)
        call("remount_root_rw", NR["mount"], None, b"/", None, 0x20 | 0x1000, None)
        call("bind_proc", NR["mount"], b"/proc", b"/tmp", None, 0x1000, None)
        call("umount_proc", NR["umount2"], b"/proc", 2)
        call("umount_dev", NR["umount2"], b"/dev", 2)
        call("fsopen", NR["fsopen"], b"tmpfs", 0)
        call("fspick", NR["fspick"], AT_FDCWD, b"/", 0)
        call("open_tree_clone", NR["open_tree"], AT_FDCWD, b"/", 1 | 0x8000)
        call("move_mount", NR["move_mount"], AT_FDCWD, b"/proc", AT_FDCWD, b"/tmp", 0)
        attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # attr_clr = MOUNT_ATTR_RDONLY
        call("mount_setattr", NR["mount_setattr"], AT_FDCWD, b"/", 0x8000, attr, 32)
        call("chroot", NR["chroot"], b"/tmp")
        call("pivot_root", NR["pivot_root"], b"/tmp", b"/tmp/new-root")
        for ns in ("mnt", "net", "pid", "uts", "ipc", "cgroup"):
            fd = os.open(f"/proc/self/ns/{ns}", os.O_RDONLY)
            call(f"setns_{ns}", NR["setns"], fd, 0)
        finish()
    """, helpers=SYSCALLS)
    assert len(res) == 18, res
    for key, value in res.items():
        assert value in DENIED, (key, res)


def test_forbidden_syscalls_through_syscall2(box):
    """The raw syscall(2) path, also with garbage in the upper 32 bits of the number (the kernel
    and seccomp both see the low 32 bits)."""
    result, res = box.py_results("""
        note("keyctl", sysc(NR["keyctl"], 0, -3, 1))
        note("unshare", sysc(NR["unshare"], 0x10000000))
        note("keyctl_high_bits", sysc((1 << 32) | NR["keyctl"], 0, -3, 1))
        note("unshare_high_bits", sysc((1 << 32) | NR["unshare"], 0x10000000))
        note("getpid_control", sysc(39))
        finish()
    """, helpers=SYSCALLS)
    assert res.pop("getpid_control") == "ok"
    for key, value in res.items():
        assert value in DENIED + ("ENOSYS",), (key, res)
    assert res["keyctl"] == "EPERM" and res["unshare"] == "EPERM", res


# getpid through int $0x80 (mov eax, 20; int 0x80; ret), run from executable memory.
I386_GETPID = r"""
import ctypes, mmap
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
code.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")
address = ctypes.addressof(ctypes.c_char.from_buffer(code))
print(ctypes.CFUNCTYPE(ctypes.c_long)(address)())
"""


def host_has_the_i386_abi():
    """Whether int $0x80 works on the host, outside any sandbox: some kernels (and VMs) have no
    32-bit entry, and the instruction then kills the process with SIGSEGV everywhere."""
    probe = subprocess.run([sys.executable, "-c", I386_GETPID], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=30)
    assert probe.returncode in (0, -signal.SIGSEGV), probe.stderr
    return probe.returncode == 0


def test_forbidden_syscalls_through_the_i386_abi(box):
    """int $0x80 from a 64-bit process: the i386 numbers must be filtered too, with an error
    rather than a silent kill."""
    if not host_has_the_i386_abi():
        pytest.skip("the kernel has no i386 ABI here: int $0x80 kills a process with SIGSEGV "
                    "outside any sandbox, so there is nothing to filter")
    result, res = box.attack("int80")
    assert result.returncode == 0, result
    assert result.stdout.endswith("done\n"), result.stdout
    res.pop("i386_getpid")  # informational: the i386 ABI may be allowed for harmless calls
    assert len(res) == 15, res
    for key, (ret, err) in res.items():
        assert ret == -1 and err in (errno.ENOSYS, errno.EPERM), (key, res)


def test_forbidden_syscalls_through_the_x32_abi(box):
    """syscall numbers with the x32 bit (0x40000000): error, not success and not a kill (the
    kernel may lack x32 entirely: then ENOSYS for all)."""
    result, res = box.attack("x32")
    assert result.returncode == 0, result
    assert result.stdout.endswith("done\n"), result.stdout
    res.pop("x32_getpid")
    assert len(res) == 9, res
    for key, (ret, err) in res.items():
        assert ret == -1 and err in (errno.ENOSYS, errno.EPERM), (key, res)


def test_the_profile_itself_answers_x32_calls_where_the_kernel_has_x32(box):
    """The x32 attack above also fails on a kernel without the x32 ABI, filter or not: here the
    control run (--seccomp none) shows whether x32 calls work at all, and if they do, the
    default profile must be what refuses them."""
    control, unfiltered = box.attack("x32", options=["--seccomp", "none"])
    assert control.returncode == 0 and control.stdout.endswith("done\n"), control
    if unfiltered["x32_getpid"][0] == -1:
        pytest.skip("this kernel has no x32 ABI (CONFIG_X86_X32_ABI off or x32 disabled), so x32 "
                    "calls fail without any filter; the default profile's x32 answer (ENOSYS) "
                    "is checked by the unit test SeccompProfile.DefaultDeniesWhatHostileCodeUses")
    assert unfiltered["x32_getpid"][0] > 0, unfiltered
    result, res = box.attack("x32")
    assert result.returncode == 0 and result.stdout.endswith("done\n"), result
    assert res["x32_getpid"] == (-1, errno.ENOSYS), res  # refused by the filter, not the kernel
    for key, (ret, err) in res.items():
        assert ret == -1 and err in (errno.ENOSYS, errno.EPERM), (key, res)


def test_the_profile_itself_refuses_bpf_where_the_kernel_allows_it(box):
    """As above for bpf: with kernel.unprivileged_bpf_disabled set, the kernel refuses the
    payload's bpf() on its own."""
    with open("/proc/sys/kernel/unprivileged_bpf_disabled") as setting:
        disabled = setting.read().strip()
    if disabled != "0":
        pytest.skip(f"kernel.unprivileged_bpf_disabled = {disabled}: this kernel refuses "
                    "unprivileged bpf() without any filter; the default profile's answer (EPERM) "
                    "is checked by the unit test SeccompProfile.DefaultDeniesWhatHostileCodeUses")
    script = """
        attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
        note("map_create", sysc(NR["bpf"], 0, attr, 128))
        finish()
    """
    _, unfiltered = box.py_results(script, helpers=SYSCALLS, options=["--seccomp", "none"])
    assert unfiltered == {"map_create": "ok"}, unfiltered
    _, res = box.py_results(script, helpers=SYSCALLS)
    assert res == {"map_create": "EPERM"}, res


def test_io_uring_is_refused(box):
    result, res = box.py_results("""
        params = ctypes.create_string_buffer(120)
        note("setup", sysc(NR["io_uring_setup"], 4, params))
        note("enter", sysc(NR["io_uring_enter"], 0, 1, 0, 0, None, 0))
        note("register", sysc(NR["io_uring_register"], 0, 0, None, 0))
        finish()
    """, helpers=SYSCALLS)
    assert res == {"setup": "EPERM", "enter": "EPERM", "register": "EPERM"}, res


def test_keyring_syscalls_are_refused(box):
    result, res = box.py_results("""
        note("keyctl_session", sysc(NR["keyctl"], 0, -3, 1))
        note("keyctl_join", sysc(NR["keyctl"], 1, b"sqbox-attack"))
        note("add_key", sysc(NR["add_key"], b"user", b"sqbox-attack", b"data", 4, -2))
        note("request_key", sysc(NR["request_key"], b"user", b"sqbox-attack", None, 0))
        finish()
    """, helpers=SYSCALLS)
    assert set(res.values()) == {"EPERM"}, res


def test_bpf_is_refused(box):
    result, res = box.py_results("""
        attr = (ctypes.c_uint32 * 32)(1, 4, 4, 1)  # BPF_MAP_TYPE_HASH, key 4, value 4, 1 entry
        note("map_create", sysc(NR["bpf"], 0, attr, 128))
        insns = (ctypes.c_uint64 * 2)(0xb7, 0x95)  # r0 = 0; exit
        prog = (ctypes.c_uint64 * 16)()
        prog[0] = 1 | (2 << 32)  # BPF_PROG_TYPE_SOCKET_FILTER, 2 instructions
        prog[1] = ctypes.addressof(insns)
        prog[2] = ctypes.addressof(ctypes.create_string_buffer(b"GPL"))
        note("prog_load", sysc(NR["bpf"], 5, prog, 128))
        finish()
    """, helpers=SYSCALLS)
    assert res == {"map_create": "EPERM", "prog_load": "EPERM"}, res


def test_perf_event_open_is_refused(box):
    """Self-monitoring of a software counter: what perf_event_paranoid allows unprivileged
    processes, and what the profile must still refuse."""
    result, res = box.py_results("""
        attr = (ctypes.c_uint32 * 32)()
        attr[0] = 1           # PERF_TYPE_SOFTWARE
        attr[1] = 128         # size
        attr[10] = 1 | 32 | 64  # disabled, exclude_kernel, exclude_hv
        note("software_self", sysc(NR["perf_event_open"], attr, 0, -1, -1, 8))
        finish()
    """, helpers=SYSCALLS)
    assert res == {"software_self": "EPERM"}, res


def test_userfaultfd_is_refused(box):
    result, res = box.py_results("""
        note("user_mode_only", sysc(NR["userfaultfd"], 0o2000000 | 1))
        note("plain", sysc(NR["userfaultfd"], 0o2000000))
        attempt("dev_userfaultfd", os.open, "/dev/userfaultfd", os.O_RDWR)
        finish()
    """, helpers=SYSCALLS)
    assert res == {"user_mode_only": "EPERM", "plain": "EPERM", "dev_userfaultfd": "ENOENT"}, res


def test_open_by_handle_at_shocker(box):
    """The "shocker" escape: a file handle for the root inode of the file system behind a
    host-backed bind mount, opened with open_by_handle_at."""
    result, res = box.py_results("""
        class Handle(ctypes.Structure):
            _fields_ = [("bytes", ctypes.c_uint32), ("type", ctypes.c_int32),
                        ("data", ctypes.c_ubyte * 128)]
        mount_fd = os.open("/attacks", os.O_RDONLY | os.O_DIRECTORY)
        own = Handle(128)
        mount_id = ctypes.c_int()
        note("name_to_handle_at", sysc(NR["name_to_handle_at"], -100, b"/attacks/attack",
                                       ctypes.byref(own), ctypes.byref(mount_id), 0))
        if RESULTS["name_to_handle_at"] == "ok":
            note("open_own_handle", sysc(NR["open_by_handle_at"], mount_fd, ctypes.byref(own), 0))
        root = Handle(8, 1)  # FILEID_INO32_GEN: inode 2 (the root of ext*), generation 0
        root.data[0] = 2
        note("open_root_inode", sysc(NR["open_by_handle_at"], mount_fd, ctypes.byref(root), 0))
        for inode in range(2, 64):  # a small brute force, as shocker did
            root.data[0] = inode
            ret, err = sysc(NR["open_by_handle_at"], mount_fd, ctypes.byref(root), 0)
            if ret >= 0:
                RESULTS[f"opened_inode_{inode}"] = os.readlink(f"/proc/self/fd/{ret}")
        finish()
    """, options=["--mount", f"{box.attacks_dir}:/attacks:ro"], helpers=SYSCALLS)
    assert res["open_root_inode"] == "EPERM", res
    assert res.get("open_own_handle", "EPERM") == "EPERM", res
    assert not [k for k in res if k.startswith("opened_inode_")], res


KERNEL_ADMIN = """
import time
now = (ctypes.c_long * 2)(int(time.time()), 0)
note("init_module", sysc(NR["init_module"], b"\\0" * 64, 64, b""))
note("finit_module", sysc(NR["finit_module"], os.open("/proc/self/exe", os.O_RDONLY), b"", 0))
note("delete_module", sysc(NR["delete_module"], b"loop", 0o4000))
note("kexec_load", sysc(NR["kexec_load"], 0, 0, None, 0))
note("kexec_file_load", sysc(NR["kexec_file_load"], -1, -1, 0, None, 0))
note("reboot", sysc(NR["reboot"], 0xfee1dead, 672274793, 0, None))  # CAD off: harmless
os.close(os.open("/tmp/swapfile", os.O_CREAT | os.O_WRONLY, 0o600))
note("swapon", sysc(NR["swapon"], b"/tmp/swapfile", 0))
note("swapoff", sysc(NR["swapoff"], b"/tmp/swapfile"))
note("acct", sysc(NR["acct"], b"/tmp/acct"))
buf = ctypes.create_string_buffer(4096)
note("syslog_read_all", sysc(NR["syslog"], 3, buf, 4096))
note("syslog_size", sysc(NR["syslog"], 10, None, 0))
now_ts = (ctypes.c_long * 2)(int(time.time()), 0)  # setting the clock to now: harmless
note("clock_settime", sysc(NR["clock_settime"], 0, now_ts))
note("settimeofday", sysc(NR["settimeofday"], now, None))
RESULTS["clock_gettime_control"] = "ok" if sysc(228, 0, now_ts)[0] == 0 else "failed"
timex = (ctypes.c_long * 26)()  # struct timex
timex[0] = 0x4000  # ADJ_TICK
timex[11] = 1000000 // os.sysconf("SC_CLK_TCK")  # the usual tick: harmless if it went through
note("adjtimex_set", sysc(NR["adjtimex"], timex))
note("clock_adjtime_set", sysc(NR["clock_adjtime"], 0, timex))
note("iopl", sysc(NR["iopl"], 3))
note("ioperm", sysc(NR["ioperm"], 0x80, 1, 1))
note("vhangup", sysc(NR["vhangup"]))
"""


def test_kernel_administration_syscalls_are_refused(box):
    result, res = box.py_results(KERNEL_ADMIN + "finish()\n", helpers=SYSCALLS)
    assert result.returncode == 0, result.stderr
    assert res.pop("clock_gettime_control") == "ok"
    assert len(res) == 18, res
    assert res == {k: "EPERM" for k in res}


def test_personality_cannot_weaken_aslr(box):
    result, res = box.py_results("""
        ret, _ = sysc(NR["personality"], 0xffffffff)
        RESULTS["query"] = ret
        note("addr_no_randomize", sysc(NR["personality"], 0x0040000))
        note("read_implies_exec", sysc(NR["personality"], 0x0400000))
        note("mmap_page_zero", sysc(NR["personality"], 0x0100000))
        ret, _ = sysc(NR["personality"], 0xffffffff)
        finish(after=ret)
    """, helpers=SYSCALLS)
    assert res["query"] == 0, res  # PER_LINUX: the query works
    assert res["after"] == 0, res
    for key in ("addr_no_randomize", "read_implies_exec", "mmap_page_zero"):
        assert res[key] == "EPERM", (key, res)


@pytest.mark.parametrize("options", [[], ["--root"]], ids=["own-uid", "--root"])
def test_capabilities_are_empty_and_no_new_privs(box, options):
    result = box.sh("cat /proc/self/status", options=options)
    assert result.returncode == 0, result.stderr
    fields = status_fields(result.stdout)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[name], 16) == 0, (name, fields[name])
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2", "no seccomp filter in the default configuration"


def test_strict_profile_refuses_sockets_but_unix_and_ptrace(box):
    script = """
        import socket
        attempt("inet_stream", socket.socket, socket.AF_INET, socket.SOCK_STREAM)
        attempt("inet_dgram", socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
        attempt("inet6_stream", socket.socket, socket.AF_INET6, socket.SOCK_STREAM)
        attempt("netlink", socket.socket, socket.AF_NETLINK, socket.SOCK_RAW, 0)
        attempt("unix", socket.socket, socket.AF_UNIX, socket.SOCK_STREAM)
        attempt("socketpair", socket.socketpair)
        buf = ctypes.create_string_buffer(8)
        local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
        remote = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
        note("vm_readv_self", sysc(310, os.getpid(), local, 1, remote, 1, 0))
        note("vm_writev_self", sysc(311, os.getpid(), local, 1, remote, 1, 0))
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(5)
            os._exit(0)
        note("ptrace_child", sysc(NR["ptrace"], 0x4206, pid, 0, 0))  # PTRACE_SEIZE
        os.kill(pid, 9)
        finish()
    """
    _, strict = box.py_results(script, options=["--seccomp", "strict"], helpers=SYSCALLS)
    _, default = box.py_results(script, helpers=SYSCALLS)
    for key in ("inet_stream", "inet_dgram", "inet6_stream", "netlink"):
        assert strict[key] in ("EPERM", "EAFNOSUPPORT"), (key, strict)
        assert default[key] == "ok", (key, default)  # control: the default profile allows them
    assert strict["unix"] == "ok" and strict["socketpair"] == "ok", strict
    for key in ("vm_readv_self", "vm_writev_self", "ptrace_child"):
        assert strict[key] == "EPERM", (key, strict)
        assert default[key] == "ok", (key, default)


def test_seccomp_none_warns_and_isolation_still_holds(box, host_sentinel, host_sleeper):
    result, res = box.py_results("""
        attempt("sentinel", open, sys.argv[2])
        attempt("host_pid", os.kill, int(sys.argv[3]), 0)
        note("unshare_user", isolated(sysc, 272, 0x10000000))  # unshare(CLONE_NEWUSER)
        status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
        finish(seccomp=status["Seccomp"].strip(), capeff=status["CapEff"].strip(),
               nnp=status["NoNewPrivs"].strip())
    """, host_sentinel.file, host_sleeper.pid, options=["--seccomp", "none"])
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "seccomp" in lines[0].lower(), result.stderr
    assert res["seccomp"] == "0" and res["nnp"] == "1" and int(res["capeff"], 16) == 0, res
    assert res["sentinel"] == "ENOENT", res
    # Without seccomp, the sandbox's user namespace allows no nested ones (max_user_namespaces 0).
    assert res["unshare_user"] == "ENOSPC", res
    if host_sleeper.pid >= 10:
        assert res["host_pid"] == "ESRCH", res


def test_custom_seccomp_profile_and_check(box, tmp_path):
    """--seccomp PATH.json (Docker's format) applies the file's rules; `sqbox seccomp check`
    accepts a good profile and rejects a malformed one with one line."""
    profile = tmp_path / "deny-mkdir.json"
    profile.write_text(json.dumps({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                      "errnoRet": errno.EACCES}]}))
    bad = tmp_path / "bad.json"
    bad.write_text('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [')
    check = subprocess.run([box.binary, "seccomp", "check", str(profile)], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check
    check = subprocess.run([box.binary, "seccomp", "check", str(bad)], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode != 0
    assert check.stderr.count("\n") == 1 and check.stderr.startswith("sqbox:"), check.stderr
    _, res = box.py_results("""
        attempt("mkdir", os.mkdir, "/tmp/d")
        attempt("write", lambda: open("/tmp/f", "w").write("x"))
        finish()
    """, options=["--seccomp", str(profile)])
    assert res == {"mkdir": "EACCES", "write": "ok"}, res
    result = box.sh("true", options=["--seccomp", str(bad)])
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("sqbox:"), result.stderr


def test_landlock_is_applied_and_reported(box, tmp_path):
    version = host_has_landlock()
    if not version:
        pytest.skip("the host kernel lacks landlock (landlock_create_ruleset version query "
                    "failed)")
    record = tmp_path / "r.json"
    result = box.sh("true", options=["--verbose", "--json", str(record)])
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "landlock" in line.lower()]
    assert len(lines) == 1, result.stderr
    assert "applied" in lines[0] and "not applied" not in lines[0], lines[0]
    data = json.loads(record.read_text())
    assert 1 <= data["landlock_abi"] <= version, data
    assert data["seccomp"] == "default", data

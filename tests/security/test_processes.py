"""Escapes through processes: seeing, signalling and tracing host processes and sqbox's init,
overwriting sqbox's binary (runc CVE-2019-5736), inherited descriptors (runc CVE-2024-21626),
and processes that try to outlive the sandbox."""
import fcntl
import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from escape_support import parse_results
from host_processes import children, wait_until_gone, wait_until_pid_namespace_is_empty

PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
NR_PTRACE, NR_PROCESS_VM_READV, NR_PIDFD_OPEN, NR_PIDFD_GETFD = 101, 310, 434, 438

# Reads one word of another process's memory through process_vm_readv.
VM_READ = """
def vm_read(pid):
    buf = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    return sysc(310, pid, local, 1, remote, 1, 0)
"""


def test_host_processes_are_invisible(box, host_sleeper):
    result, res = box.py_results("""
        host_pid = int(sys.argv[2])
        cmdlines = {}
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                cmdlines[pid] = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError as e:
                cmdlines[pid] = ename(e.errno)
        attempt("proc_entry", os.stat, f"/proc/{host_pid}")
        attempt("kill0", os.kill, host_pid, 0)
        finish(cmdlines=cmdlines, me=os.getpid())
    """, host_sleeper.pid)
    cmdlines = res["cmdlines"]
    assert "sleep\x00100000\x00" not in "".join(cmdlines.values())
    assert len(cmdlines) <= 3, cmdlines  # init, the payload (and at most a transient helper)
    assert res["me"] < 10
    if host_sleeper.pid >= 10:  # a host pid equal to a sandbox pid would name a sandbox process
        assert res["proc_entry"] == "ENOENT" and res["kill0"] == "ESRCH", res


def test_host_processes_cannot_be_signalled(box, host_sleeper):
    result, res = box.py_results("""
        import signal
        host_pid = int(sys.argv[2])
        attempt("kill", os.kill, host_pid, signal.SIGKILL)
        attempt("kill_group", os.kill, -host_pid, signal.SIGKILL)
        note("pidfd_open", sysc(434, host_pid, 0))
        attempt("kill_all", os.kill, -1, signal.SIGKILL)  # every process the payload may signal
        finish(survived=True)
    """, host_sleeper.pid)
    assert res["survived"] is True
    if host_sleeper.pid >= 10:
        assert res["kill"] == "ESRCH" and res["kill_group"] == "ESRCH", res
        assert res["pidfd_open"] == "ESRCH", res
    # allowed, but confined to the sandbox (ESRCH: nothing there the payload may signal)
    assert res["kill_all"] in ("ok", "ESRCH"), res
    time.sleep(0.2)
    assert host_sleeper.poll() is None


def test_host_processes_cannot_be_traced(box, host_sleeper):
    result, res = box.py_results("""
        host_pid = int(sys.argv[2])
        note("ptrace_attach", sysc(101, 16, host_pid, 0, 0))
        note("ptrace_seize", sysc(101, 0x4206, host_pid, 0, 0))
        note("vm_readv", vm_read(host_pid))
        attempt("mem", open, f"/proc/{host_pid}/mem", "rb")
        finish()
    """, host_sleeper.pid, helpers=VM_READ)
    if host_sleeper.pid < 10:
        pytest.fail(f"host sleeper has pid {host_sleeper.pid}; cannot tell it from sandbox pids")
    for key in ("ptrace_attach", "ptrace_seize", "vm_readv"):
        assert res[key] in ("ESRCH", "EPERM"), res
    assert res["mem"] == "ENOENT", res
    status = open(f"/proc/{host_sleeper.pid}/status").read()
    assert "TracerPid:\t0" in status


def test_init_cannot_be_traced_or_plundered(box):
    """sqbox's init (pid 1) runs sqbox's own code: no ptrace, no memory, no fds, no namespaces,
    no root or cwd, no environment."""
    result, res = box.py_results("""
        note("ptrace_attach", sysc(101, 16, 1, 0, 0))
        note("ptrace_seize", sysc(101, 0x4206, 1, 0, 0))
        note("vm_readv", vm_read(1))
        attempt("mem", open, "/proc/1/mem", "rb")
        attempt("environ", open, "/proc/1/environ", "rb")
        for fd in attempt("fd_dir", os.listdir, "/proc/1/fd") or range(0, 8):
            attempt(f"fd_link_{fd}", os.readlink, f"/proc/1/fd/{fd}")
            attempt(f"fd_open_{fd}", os.open, f"/proc/1/fd/{fd}", os.O_RDONLY)
        attempt("root", os.listdir, "/proc/1/root")
        attempt("cwd", os.listdir, "/proc/1/cwd")
        attempt("ns_mnt", open, "/proc/1/ns/mnt", "rb")
        attempt("ns_user", open, "/proc/1/ns/user", "rb")
        attempt("map_files", os.listdir, "/proc/1/map_files")
        pidfd = note("pidfd_open", sysc(434, 1, 0))
        for fd in range(0, 8):
            note(f"pidfd_getfd_{fd}", sysc(438, pidfd, fd, 0))
        finish(init_state=open("/proc/1/stat").read().split(") ")[1].split()[0])
    """, helpers=VM_READ)
    assert result.returncode == 0, result.stderr
    assert res["ptrace_attach"] == "EPERM" and res["ptrace_seize"] == "EPERM", res
    assert res["vm_readv"] == "EPERM", res
    for key in ("mem", "environ", "root", "cwd", "ns_mnt", "ns_user", "map_files"):
        assert res[key] in ("EACCES", "EPERM"), (key, res)
    # Listing /proc/1/fd shows numbers only (allowed where init's uid owns it); following any
    # of them must fail.
    links = [k for k in res if k.startswith(("fd_link_", "fd_open_"))]
    assert links, res
    for key in links:
        assert res[key] in ("EACCES", "EPERM"), (key, res)
    assert res["pidfd_open"] == "ok", res  # not itself a hole; what it grants is checked here:
    for fd in range(0, 8):
        assert res[f"pidfd_getfd_{fd}"] == "EPERM", res
    assert res["init_state"] in ("S", "R"), res


@pytest.mark.parametrize("signals", [["SIGKILL"], ["SIGTERM"],
                                     ["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT",
                                      "SIGSTOP"]],
                         ids=["kill-9", "kill-TERM", "all"])
def test_killing_init_does_not_change_the_payloads_status(box, signals):
    """A payload signalling its own init: init survives, and sqbox reports the payload's own
    exit status (signals from inside the sandbox are not bounced back to the payload)."""
    result = box.py("""
        import signal, time
        for name in sys.argv[2:]:
            attempt(name, os.kill, 1, getattr(signal, name))
        time.sleep(0.3)
        finish(init_state=open("/proc/1/stat").read().split(") ")[1].split()[0])
        raise SystemExit(7)
    """, *signals)
    res = parse_results(result.stdout)
    assert result.returncode == 7, result
    # Refused (EPERM) or delivered and ignored: either way init lives on.
    assert res.pop("init_state") in ("S", "R"), res
    assert all(outcome in ("ok", "EPERM") for outcome in res.values()), res
    assert sorted(res) == sorted(signals)


def test_daemon_does_not_outlive_the_sandbox(box, marker):
    """Double fork + setsid, stdio detached: the daemon dies with the sandbox, and sqbox does not
    wait for it."""
    start = time.monotonic()
    result = box.py("""
        import time
        first = os.fork()
        if first == 0:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv("/bin/sleep", ["sleep", "60"])  # no marker in its command line
            # Only once the daemon really runs (a failed exec would leave nothing to outlive).
            for _ in range(500):
                with open(f"/proc/{daemon}/cmdline", "rb") as cmdline:
                    if cmdline.read() == b"sleep\\0" + b"60\\0":
                        print("daemon running", flush=True)
                        break
                time.sleep(0.01)
            os._exit(0)
        os.waitpid(first, 0)
        print(os.readlink("/proc/self/ns/pid"), flush=True)
    """, options=["--timeout", "30"])
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result
    running, namespace = result.stdout.strip().splitlines()
    assert running == "daemon running", result.stdout
    assert namespace.startswith("pid:["), result.stdout
    assert elapsed < 10
    assert wait_until_pid_namespace_is_empty(namespace, 5) == []
    assert wait_until_gone(marker) == []


def test_timeout_kills_processes_that_ignore_signals(box, marker):
    start = time.monotonic()
    result = box.sh("readlink /proc/self/ns/pid; trap '' TERM HUP INT QUIT; "
                    "(trap '' TERM HUP INT QUIT; sleep 100; :) & sleep 100; :",
                    options=["--timeout", "1"])
    elapsed = time.monotonic() - start
    assert result.returncode == 124, result
    assert "timed out" in result.stderr
    assert elapsed < 10
    namespace = result.stdout.strip()
    assert namespace.startswith("pid:["), result.stdout
    assert wait_until_pid_namespace_is_empty(namespace, 5) == []
    assert wait_until_gone(marker) == []


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_sqbox_binary_cannot_be_overwritten_through_proc_exe(box, sqbox_bin, python_image):
    """runc CVE-2019-5736: /proc/1/exe (init runs sqbox's binary) and /proc/self/exe opened for
    writing, directly and by re-opening an O_PATH descriptor; exec of /proc/1/exe."""
    binary_before = _sha256(sqbox_bin)
    image_before = _sha256(python_image)
    result, res = box.py_results("""
        import subprocess
        evil = b"#!/bin/sh\\necho pwned\\n"
        def overwrite(path, flags=os.O_WRONLY | os.O_TRUNC):
            fd = os.open(path, flags)
            os.write(fd, evil)
            os.close(fd)
        attempt("init_exe_write", overwrite, "/proc/1/exe")
        attempt("init_exe_readlink", os.readlink, "/proc/1/exe")
        attempt("init_exe_read", open, "/proc/1/exe", "rb")
        path_fd = attempt("init_exe_opath", os.open, "/proc/1/exe", os.O_PATH)
        if path_fd is not None:
            attempt("init_exe_reopen", overwrite, f"/proc/self/fd/{path_fd}")
        attempt("self_exe_write", overwrite, "/proc/self/exe", os.O_WRONLY)
        for pid in [p for p in os.listdir("/proc") if p.isdigit() and p not in ("1",)]:
            attempt(f"exe_write_{pid}", overwrite, f"/proc/{pid}/exe", os.O_WRONLY)
        attempt("exec_init_exe", subprocess.run, ["/proc/1/exe", "--version"])
        attempt("map_files", os.listdir, "/proc/1/map_files")
        finish()
    """)
    assert result.returncode == 0, result.stderr
    assert res["init_exe_write"] == "EACCES", res
    assert res["init_exe_readlink"] == "EACCES" and res["init_exe_read"] == "EACCES", res
    assert res["init_exe_opath"] == "EACCES", res
    assert res["self_exe_write"] == "ETXTBSY", res
    for key, value in res.items():
        if key.startswith("exe_write_"):
            assert value in ("ETXTBSY", "EACCES"), (key, res)
    assert res["exec_init_exe"] == "EACCES", res
    assert res["map_files"] in ("EACCES", "EPERM"), res
    assert "pwned" not in result.stdout
    assert _sha256(sqbox_bin) == binary_before
    assert _sha256(python_image) == image_before


def _free_fds(count, start):
    """count descriptor numbers from start up that nothing in this process uses (pytest's output
    capture holds a few low ones)."""
    free = []
    fd = start
    while len(free) < count:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            free.append(fd)
        fd += 1
    return free


@pytest.fixture
def leaked_host_fds(host_sentinel):
    """Descriptors a careless caller leaks into sqbox: the host sentinel directory twice, the
    sentinel file, and the host's root directory (returned in that order)."""
    targets = _free_fds(2, 7) + _free_fds(2, 200)
    opened = []
    for path, flags in ((host_sentinel.dir, os.O_RDONLY | os.O_DIRECTORY),
                        (host_sentinel.file, os.O_RDONLY), ("/", os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(path, flags)
        # moved above the targets, so that dup2 never closes a source
        opened.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000))
        os.close(fd)
    fds = []
    for source, target in zip((opened[0], opened[1], opened[0], opened[2]), targets):
        fds.append(os.dup2(source, target, inheritable=True))
    for fd in opened:
        os.close(fd)
    yield tuple(fds)
    for fd in fds:
        os.close(fd)


def test_inherited_descriptors_do_not_reach_the_host(box, host_sentinel, leaked_host_fds):
    """runc CVE-2024-21626: scan every fd number through fstat, openat(fd, ".."),
    /proc/self/fd/N/.. and /proc/1/fd/N."""
    result, res = box.py_results("""
        listed = sorted(int(n) for n in os.listdir("/proc/self/fd"))
        reached = {}
        for fd in range(3, 256):
            for how, fn in (("fstat", lambda: os.fstat(fd)),
                            ("openat_dotdot", lambda: os.open("..", os.O_RDONLY, dir_fd=fd)),
                            ("proc_self", lambda: os.listdir(f"/proc/self/fd/{fd}/..")),
                            ("proc_init", lambda: os.listdir(f"/proc/1/fd/{fd}")),
                            ("proc_init_open", lambda: os.open(f"/proc/1/fd/{fd}", os.O_RDONLY))):
                try:
                    value = fn()
                    reached[f"{how}_{fd}"] = str(value)
                except OSError:
                    pass
        attempt("init_cwd", os.listdir, "/proc/1/cwd")
        finish(listed=listed, reached=reached)
    """, pass_fds=leaked_host_fds)
    assert host_sentinel.secret not in result.stdout + result.stderr
    assert "secret.txt" not in result.stdout
    # os.listdir holds one descriptor (3) on /proc/self/fd while listing it.
    assert res["listed"] == [0, 1, 2, 3], res
    assert res["reached"] == {}, res
    assert res["init_cwd"] == "EACCES", res


@pytest.mark.parametrize("which", [0, 3], ids=["sentinel-dir", "host-root"])
def test_workdir_through_an_inherited_descriptor_is_refused(box, host_sentinel, leaked_host_fds,
                                                            which):
    """runc CVE-2024-21626's actual exploit: the working directory set to /proc/self/fd/N."""
    fd = leaked_host_fds[which]
    result = box.sh("pwd; ls; cat secret.txt; ls ../../..",
                    options=["--workdir", f"/proc/self/fd/{fd}"], pass_fds=leaked_host_fds)
    assert host_sentinel.secret not in result.stdout + result.stderr
    assert "secret.txt" not in result.stdout
    assert result.returncode == 125, result
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("sqbox:"), result.stderr


def _descriptors(pid):
    """{fd: what it refers to} of a host process (needs root: sandbox processes are not
    dumpable)."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # closed meanwhile
            pass
    return found


def _settled_init_descriptors(pid, deadline_s=10.0):
    """Init's descriptors once it has let the payload go: it sends the start word before it
    closes its end of the start signal, and watches for the exec on a signalfd for a moment
    after, so the payload's first line can come before init is done with either. A descriptor
    init kept for good is still there at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = _descriptors(pid)
        passing = [w for w in found.values() if w.startswith("socket:") or "signalfd" in w]
        if not passing or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _ns_pids(pid):
    status = open(f"/proc/{pid}/status").read()
    return [int(p) for p in status.split("NSpid:")[1].splitlines()[0].split()]


def _peer_command_line(socket_link):
    """The command line of the process holding the other end of a Unix socket ("socket:[N]")."""
    inode = socket_link[len("socket:["):-1]
    listing = subprocess.run(["ss", "-xan"], capture_output=True, text=True, check=True).stdout
    peers = [fields[-1] for fields in (line.split() for line in listing.splitlines())
             if len(fields) >= 8 and fields[5] == inode]
    assert len(peers) == 1, (inode, listing)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if f"socket:[{peers[0]}]" in links:
            return Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


@pytest.mark.parametrize("options", [[], ["--output-limit", "1M"]],
                         ids=["plain", "output-limit"])
def test_sandbox_processes_hold_only_their_own_descriptors(box, options):
    """Each process owns its descriptors and closes what it hands on: init keeps its report,
    lifeline and the payload's exec status (and the copy of the caller's stderr its own messages
    go to); the payload only stdio; the supervisor not init's channel. A missed close would be a
    host descriptor in the sandbox."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the sandbox's processes are not dumpable, so only root can "
                    "read their descriptors")
    # The payload says ready only once it runs its own code: a shell that echoes and then execs
    # would be read while the loader of the next program still holds the libraries it maps.
    payload_code = "import time; print('ready', flush=True); time.sleep(60)"
    argv = box.argv(box.python_image, ["python3", "-c", payload_code, box.marker],
                    ["--timeout", "60", *options])
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline() == "ready\n"
            supervisor = [p for p in children(proc.pid) if len(_ns_pids(p)) == 1]
            assert len(supervisor) == 1, supervisor
            below = children(supervisor[0])
            init = [p for p in below if _ns_pids(p)[-1] == 1]
            assert len(init) == 1, below
            payload = children(init[0])
            assert len(payload) == 1, payload
            init_fds = _settled_init_descriptors(init[0])
            payload_fds = _descriptors(payload[0])
            supervisor_fds = _descriptors(supervisor[0])
            socket_peers = [_peer_command_line(what) for what in supervisor_fds.values()
                            if what.startswith("socket:")]
            callers_stderr = os.readlink(f"/proc/{proc.pid}/fd/2")
        finally:
            proc.kill()
    assert set(payload_fds) <= {0, 1, 2}, payload_fds
    own = sorted(what for fd, what in init_fds.items() if fd > 2)
    # Output is relayed (capped) by default: sqbox's own messages go to the caller's stderr, not
    # to the relayed stream, through a copy init holds.
    assert callers_stderr in own, (callers_stderr, init_fds)
    own.remove(callers_stderr)
    assert len(own) == 3 and all(what.startswith("pipe:") for what in own), init_fds
    # One socket: its connection to the image's shared server (not init's channel, say).
    assert len(socket_peers) == 1 and "image-server" in socket_peers[0], supervisor_fds

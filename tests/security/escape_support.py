"""Helpers shared by the escape tests (imported by conftest.py and the test modules)."""
import json
import os
import time

# Default wall-clock limit given to every sandbox, and how much longer pytest waits for sqbox.
SANDBOX_TIMEOUT = 20
GRACE = 20

# ---------------------------------------------------------------------------------------------
# Payload side: a prelude every Python attack script starts with.

PRELUDE = r'''
import ctypes, errno, json, os, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
RESULTS = {}

def _arg(value):
    if isinstance(value, int):
        return ctypes.c_long(value & 0xFFFFFFFFFFFFFFFF if value >= 0 else value)
    return value

def sysc(nr, *args):
    """The raw syscall(2) path: returns (ret, errno)."""
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return ret, ctypes.get_errno()

def ename(err):
    return errno.errorcode.get(err, str(err))

def note(key, outcome):
    """Records a (ret, errno) pair as "ok" or the errno name; returns ret."""
    ret, err = outcome
    RESULTS[key] = "ok" if ret >= 0 else ename(err)
    return ret

def attempt(key, fn, *args):
    """Records fn(*args) as "ok" or the errno name of the OSError it raised."""
    try:
        value = fn(*args)
    except OSError as e:
        RESULTS[key] = ename(e.errno)
        return None
    RESULTS[key] = "ok"
    return value

def isolated(fn, *args):
    """fn(*args) -> (ret, errno), run in a child process so that a call that succeeds (a new
    namespace, a chroot) cannot change what the following attempts see."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            outcome = list(fn(*args))
        except BaseException:
            outcome = [-1, -1]
        os.write(w, json.dumps(outcome).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not data:  # the child died before answering: report the signal as the "errno"
        return -1, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1
    return tuple(json.loads(data))

def finish(**extra):
    RESULTS.update(extra)
    print("RESULTS " + json.dumps(RESULTS), flush=True)
'''


def parse_results(stdout):
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])
    return None


def parse_attack_lines(stdout):
    """Output of attacks/attack.c: "NAME RET ERRNO" lines ("NAME killed SIGNAL" for an attempt
    that died), then "done"."""
    results = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].lstrip("-").isdigit():
            results[parts[0]] = (int(parts[1]), int(parts[2]))
        elif len(parts) == 3:
            results[parts[0]] = (parts[1], int(parts[2]))
    return results


# ---------------------------------------------------------------------------------------------
# Host side.

def processes_with(token):
    """Pids of processes (ours excluded) whose command line contains token."""
    found = []
    needle = token.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry))
    return found


def processes_in_pid_namespace(namespace):
    """Pids of host processes in namespace (as /proc/PID/ns/pid reads, e.g. "pid:[4026532]")."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until_empty(namespace, seconds=5.0):
    deadline = time.monotonic() + seconds
    left = processes_in_pid_namespace(namespace)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_in_pid_namespace(namespace)
    return left


def wait_until_gone(token, seconds=5.0):
    deadline = time.monotonic() + seconds
    left = processes_with(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_with(token)
    return left


def descendants(pid):
    """pid and everything below it, as {pid: start time} (a reused pid is not mistaken)."""
    found, todo = {}, [pid]
    while todo:
        current = todo.pop()
        started = _start_time(current)
        if started is None or current in found:
            continue
        found[current] = started
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo += [int(child) for child in children.read().split()]
            except OSError:
                pass
    return found


def wait_until_ended(processes, seconds=10.0):
    """Those of {pid: start time} still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = sorted(p for p, started in processes.items() if _start_time(p) == started)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _start_time(pid):
    """Field 22 of /proc/PID/stat; None once the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def tree_digest(path):
    """Names, types, modes and contents of everything below path."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            data = None
            if os.path.islink(full):
                data = os.readlink(full)
            elif os.path.isfile(full):
                with open(full, "rb") as f:
                    data = f.read()
            entries.append((os.path.relpath(full, path), st.st_mode, st.st_size, data))
    return entries



def status_fields(text):
    """/proc/PID/status as a dict."""
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key: value.strip() for key, value in pairs}


def host_has_landlock():
    """The landlock ABI version on this host, 0 when the kernel lacks it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
    return max(version, 0)

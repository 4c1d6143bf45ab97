"""Helpers shared by the escape tests (imported by conftest.py and the test modules)."""
import json
import os

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

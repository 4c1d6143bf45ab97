"""Host-side views of sandboxes' processes, for the checks that none outlives its sandbox.

Shared by the integration, escape and client suites: each suite's conftest.py puts this
directory on sys.path.
"""
import os
import time
from pathlib import Path

# A payload prefix that prints the sandbox's pid namespace ("pid:[INODE]", as the host names
# it) first: the sandbox's processes are then found by namespace, whatever their argv.
PRINT_PID_NAMESPACE = "readlink /proc/self/ns/pid; "


def processes_in_pid_namespace(namespace):
    """Host pids of the processes in `namespace` (zombies included)."""
    # Anything but "pid:[INODE]" would match no process, and a check for none left would pass.
    assert namespace.startswith("pid:["), namespace
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                found.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to look into
            continue
    return found


def processes_with(token):
    """Pids of processes (ours excluded) whose command line contains `token`."""
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


def cmdline(pid):
    """pid's command line with spaces for NULs, "?" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def _start_time(pid):
    """The process's start time in clock ticks (field 22 of stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has finished; only its exit status is left to collect
        return None
    return int(fields[19])


def children(pid):
    """The children of all of pid's threads; none once it is gone."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return found


def descendants(pid):
    """pid and all its descendants, as {pid: start time} (so a reused pid is not mistaken).
    Those that end during the walk are left out."""
    result, todo = {}, [pid]
    while todo:
        current = todo.pop()
        start = _start_time(current)
        if start is None or current in result:
            continue
        result[current] = start
        todo += children(current)
    return result


def still_alive(processes):
    """Those of {pid: start time} that still run (same pid and same start time)."""
    return sorted(pid for pid, start in processes.items() if _start_time(pid) == start)


def wait_for_descendants(pid, command, count=1, timeout=30.0):
    """pid's descendants (as descendants()) once `count` of them run `command` (a cmdline with
    spaces for NULs); fails if they do not appear within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = descendants(pid)
        running = [p for p in found if cmdline(p).strip() == command]
        if len(running) >= count:
            return found
        assert time.monotonic() < deadline, \
            f"{count} x {command!r} not running below {pid} after {timeout} s"
        time.sleep(0.02)


# Where a process waits for a FUSE request's answer, as its wchan names it (the first is the
# kernel's function; the others are its callers, should a build inline it).
FUSE_WAITS = ("request_wait_answer", "__fuse_request_send", "__fuse_simple_request",
              "fuse_simple_request")


def wait_for_a_fuse_request(pid, timeout=30.0):
    """Waits until one of pid's descendants waits for a FUSE request's answer (its wchan, which
    the user of a process may read); fails if none does within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for process in descendants(pid):
            try:
                if Path(f"/proc/{process}/wchan").read_text() in FUSE_WAITS:
                    return process
            except OSError:  # gone meanwhile
                pass
        assert time.monotonic() < deadline, f"nothing below {pid} waits on FUSE after {timeout} s"
        time.sleep(0.02)


# The waits for processes to end: each returns what is left after up to `seconds` (nothing
# as soon as nothing is), for the caller to assert on.

def _until_none_left(left_now, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = left_now()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def wait_until_pid_namespace_is_empty(namespace, seconds=10.0):
    """Pids still in `namespace` after up to `seconds`."""
    return _until_none_left(lambda: processes_in_pid_namespace(namespace), seconds)


def wait_until_gone(token, seconds=5.0):
    """Pids still carrying `token` in their command line after up to `seconds`."""
    return _until_none_left(lambda: processes_with(token), seconds)


def wait_until_ended(processes, seconds=10.0):
    """Those of {pid: start time} still running after up to `seconds`."""
    return _until_none_left(lambda: still_alive(processes), seconds)


def sandbox_cgroups_of(launcher_pid):
    """The cgroup directories sqbox made for the run of `launcher_pid` (sqbox-PID-RANDOM)."""
    found = []
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(top, d) for d in dirs if d.startswith(f"sqbox-{launcher_pid}-")]
        dirs[:] = [d for d in dirs if not d.startswith("sqbox-")]
    return found

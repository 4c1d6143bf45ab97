"""Process and mount inspection for the no-debris tests (Linux /proc)."""
import os
import time
from pathlib import Path

FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")


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
    """pid and all its descendants, as {pid: start time} (so a reused pid is not mistaken)."""
    result, todo = {}, [pid]
    while todo:
        current = todo.pop()
        start = _start_time(current)
        if start is None or current in result:
            continue
        result[current] = start
        todo += children(current)
    return result


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


def still_alive(processes):
    """Those of {pid: start time} that still run (same pid and same start time)."""
    return sorted(pid for pid, start in processes.items() if _start_time(pid) == start)


def wait_all_gone(processes, timeout):
    deadline = time.monotonic() + timeout
    while still_alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return still_alive(processes)


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def fuse_connections():
    """FUSE connection ids, or None where fusectl is not mounted (then they cannot be seen)."""
    if not FUSE_CONNECTIONS.is_dir() or not os.path.ismount(FUSE_CONNECTIONS):
        return None
    return sorted(os.listdir(FUSE_CONNECTIONS))


def mountinfo():
    """Our mount table as text (sandboxes must not leave a mount in it)."""
    return Path("/proc/self/mountinfo").read_text()


def new_fuse_connections(before, wait=5.0):
    """FUSE connections that exist now but did not before, after waiting up to `wait` seconds
    for them to go (connections of earlier tests may still be going away: those are not new)."""
    if before is None:
        return []
    deadline = time.monotonic() + wait
    while True:
        new = sorted(set(fuse_connections() or []) - set(before))
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.05)

"""Host-side views of mounts and FUSE connections, for the checks that a sandbox leaves none.

Shared by the integration and client suites: each suite's conftest.py puts this directory on
sys.path.
"""
import os
import time
from pathlib import Path

FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")


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

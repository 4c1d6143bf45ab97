"""Host-side views of a sandbox's processes, for checks that none outlive it."""
import os
import time

# A payload prefix that prints the sandbox's pid namespace ("pid:[INODE]", as the host names
# it) first: the sandbox's processes are then found by namespace, whatever their argv.
PRINT_PID_NAMESPACE = "readlink /proc/self/ns/pid; "


def processes_in_pid_namespace(namespace):
    """Host pids of the processes in `namespace` (zombies included)."""
    assert namespace.startswith("pid:["), namespace
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


def wait_until_pid_namespace_is_empty(namespace, seconds=10.0):
    """Pids still in `namespace` after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = processes_in_pid_namespace(namespace)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)

"""No debris: after any ending, no process, mount, FUSE connection or temp file remains."""
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from host_mounts import fuse_connections
from host_processes import (PRINT_PID_NAMESPACE, processes_with, sandbox_cgroups_of,
                            wait_until_gone, wait_until_pid_namespace_is_empty)


class Snapshot:
    def __init__(self):
        self.mountinfo = Path("/proc/self/mountinfo").read_text()
        self.fuse = fuse_connections()
        self.tmp = sorted(os.listdir("/tmp"))
        self.shm = sorted(os.listdir("/dev/shm"))


def assert_clean(before, token, wait=0.0, pid_namespace=None):
    """Nothing left: no process with the token (sqbox's own carry the launcher's argv), none in
    the sandbox's pid namespace if given (the payload's children carry no token), no mount, FUSE
    connection or temp file."""
    deadline = time.monotonic() + wait
    assert wait_until_gone(token, wait) == [], "sandbox processes left behind"
    if pid_namespace is not None:
        left = wait_until_pid_namespace_is_empty(pid_namespace, max(wait, 1.0))
        assert left == [], f"processes left in the sandbox's pid namespace: {left}"
    def new_connections():
        # Connections of earlier runs may still be going away: only new ones are debris.
        return sorted(set(fuse_connections()) - set(before.fuse))

    if before.fuse is not None:
        # A shared image server this test started leaves after its idle second.
        deadline = max(deadline, time.monotonic() + 5.0)
        while new_connections() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert new_connections() == [], "FUSE connection left behind"
    assert Path("/proc/self/mountinfo").read_text() == before.mountinfo
    # sqbox itself never creates host files; names the project's own tools use for their temp
    # directories (a benchmark or a test run going on beside this one) are not sqbox's debris.
    tools = ("sqbox-bench-", "sqbox-test-stage.", "sqbox-unit-", "sqbox-image-")
    new_tmp = set(os.listdir("/tmp")) - set(before.tmp)
    assert not [n for n in new_tmp if "sqbox" in n and not n.startswith(tools)], new_tmp
    assert sorted(os.listdir("/dev/shm")) == before.shm


@pytest.fixture(autouse=True)
def short_lived_image_servers(monkeypatch):
    """A shared image server these runs start stays 1 s after its last sandbox (the default is
    60 s): then it, too, must be gone (assert_clean waits that long for FUSE connections)."""
    monkeypatch.setenv("SQBOX_IMAGE_SERVER_IDLE", "1")


@pytest.fixture
def token():
    return "sqbox-debris-" + uuid.uuid4().hex


def test_fusectl_visibility_is_reported():
    # Not a skip: the other tests still check processes, mounts and files; this one records
    # whether FUSE connections were checked too (fusectl is mounted by scripts/test as root).
    state = "checked" if fuse_connections() is not None else "not mounted, connection count unchecked"
    print(f"FUSE connections: {state}")


def test_after_normal_exit(sqbox, python_image, token):
    before = Snapshot()
    result = sqbox.run(python_image, "sh", "-c",
                       PRINT_PID_NAMESPACE + "sleep 100 & python3 -c pass; exit 3", token)
    assert result.returncode == 3
    assert_clean(before, token, pid_namespace=result.stdout.split()[0])


def test_after_timeout(sqbox, busybox_image, token):
    before = Snapshot()
    result = sqbox.run(busybox_image, "sh", "-c", PRINT_PID_NAMESPACE + "sleep 100 & sleep 100",
                       token, options=["--timeout", "0.5"])
    assert result.returncode == 124
    assert_clean(before, token, pid_namespace=result.stdout.split()[0])


def test_after_payload_crash(sqbox, busybox_image, token):
    before = Snapshot()
    result = sqbox.run(busybox_image, "sh", "-c", PRINT_PID_NAMESPACE + "sleep 100 & kill -SEGV $$",
                       token)
    assert result.returncode == 128 + signal.SIGSEGV
    assert_clean(before, token, pid_namespace=result.stdout.split()[0])


def test_after_setup_failure(sqbox, busybox_image, token, tmp_path):
    before = Snapshot()
    result = sqbox.run(busybox_image, "sh", "-c", "true", token,
                       options=["--mount", f"{tmp_path}:/bin/sh/x"])
    assert result.returncode == 125
    assert_clean(before, token)


def assert_gone(pids, wait):
    """The processes themselves, zombies included: an exiting process's cmdline reads empty, so
    processes_with() alone would miss one that can never finish exiting."""
    deadline = time.monotonic() + wait
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == [], "processes never ended"


def test_after_kill_9_of_sqbox(sqbox, python_image, token):
    before = Snapshot()
    proc = sqbox.popen(python_image, "sh", "-c",
                       PRINT_PID_NAMESPACE + "sleep 1000 & echo ready; sleep 1000", token,
                       stdout=subprocess.PIPE, text=True)
    namespace = proc.stdout.readline().strip()
    assert proc.stdout.readline() == "ready\n"
    pids = processes_with(token)
    assert len(pids) >= 4  # launcher, supervisor, FUSE server, init, payload
    proc.kill()
    proc.wait(timeout=10)
    assert_gone(pids, wait=10.0)
    assert_clean(before, token, wait=10.0, pid_namespace=namespace)


@pytest.mark.parametrize("delay", [0.15, 0.3, 0.6])
def test_after_kill_9_of_sqbox_while_the_payload_reads_the_image(sqbox, python_image, token,
                                                                  delay):
    # Reads in flight and the image server's prefetch busy when everything is killed: neither
    # may keep a process or the FUSE connection alive (a prefetch that waits on a page of a read
    # in flight would, once the thread that answers reads is gone).
    before = Snapshot()
    proc = sqbox.popen(python_image, "sh", "-c",
                       "echo ready; while :; do find /usr -type f -size +4k -exec cat {} + "
                       ">/dev/null 2>&1; done", token, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(delay)
    pids = processes_with(token)
    proc.kill()
    proc.wait(timeout=10)
    assert_gone(pids, wait=10.0)
    assert_clean(before, token, wait=10.0)


def test_after_kill_9_of_the_supervisor(sqbox, busybox_image, token):
    before = Snapshot()
    proc = sqbox.popen(busybox_image, "sh", "-c", "echo ready; sleep 1000", token,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1
    os.kill(int(children[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 125
    assert "supervisor died unexpectedly" in err
    assert_clean(before, token, wait=10.0)


def test_a_cgroup_left_by_kill_9_of_sqbox_is_removed_by_the_next_run(sqbox, busybox_image, token):
    if os.geteuid() != 0:
        pytest.skip("needs root: an ordinary user's sandbox gets a cgroup only with --cgroup")
    proc = sqbox.popen(busybox_image, "sh", "-c", "echo ready; sleep 1000", token,
                       stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    pids = processes_with(token)
    left = sandbox_cgroups_of(proc.pid)
    assert left, "the root run made no cgroup"
    proc.kill()
    proc.wait(timeout=10)
    assert_gone(pids, wait=10.0)
    assert all(os.path.isdir(path) for path in left)  # nobody was left to remove them
    result = sqbox.run(busybox_image, "true")
    assert result.returncode == 0, result.stderr
    assert [path for path in left if os.path.exists(path)] == []


@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_a_root_run_removes_its_cgroups_from_every_hierarchy(sqbox, busybox_image, ending):
    if os.geteuid() != 0:
        pytest.skip("needs root: an ordinary user's sandbox gets a cgroup only with --cgroup")
    options = ["--timeout", "1.5"] if ending == "timeout" else []
    # The exiting run ends when the test, having looked at its cgroups, closes its stdin.
    script = "echo ready; sleep 30" if ending == "timeout" else "echo ready; cat >/dev/null"
    proc = sqbox.popen(busybox_image, "sh", "-c", script, options=options,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    made = sandbox_cgroups_of(proc.pid)
    # One per v1 hierarchy (memory and pids), or one cgroup v2 directory.
    assert made, "the root run made no cgroup"
    proc.communicate(timeout=30)
    assert proc.returncode == (124 if ending == "timeout" else 0)
    assert [path for path in made if os.path.exists(path)] == []
    assert sandbox_cgroups_of(proc.pid) == []

"""Timeouts and resource limits."""
import json
import os

import pytest
import signal
import subprocess
import time
from pathlib import Path

from host_processes import sandbox_cgroups_of


def test_timeout_kills_the_whole_sandbox(sqbox, busybox_image, tmp_path):
    record = tmp_path / "r.json"
    start = time.monotonic()
    result = sqbox.run(busybox_image, "sh", "-c", "sleep 100 & sleep 100",
                       options=["--timeout", "1", "--json", str(record)])
    elapsed = time.monotonic() - start
    assert result.returncode == 124
    assert result.stderr == "sqbox: timed out after 1 s; sandbox killed\n"
    assert elapsed < 30
    data = json.loads(record.read_text())
    assert data["timed_out"] is True
    assert data["exit_code"] == 124
    assert data["wall_ms"] >= 1000


def test_timeout_not_reached(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "exit 5", options=["--timeout", "30"])
    assert result.returncode == 5


def test_cpu_time_limit(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "while :; do :; done", options=["--cpu-time", "1"])
    assert result.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


def run_with_record(sqbox, image, tmp_path, *command, options=(), **kwargs):
    record = tmp_path / "record.json"
    result = sqbox.run(image, *command, options=[*options, "--json", str(record)], **kwargs)
    return result, json.loads(record.read_text())


def test_default_limits_and_their_mechanisms_are_reported(sqbox, busybox_image, tmp_path):
    result, data = run_with_record(sqbox, busybox_image, tmp_path, "true")
    assert result.returncode == 0
    limits = data["limits"]
    assert limits["memory"]["value"] == 4 << 30
    assert limits["pids"]["value"] == 512
    assert limits["file_size"] == {"value": None, "enforced_by": "none"}
    assert limits["open_files"]["value"] == 4096
    assert limits["cpu_time"] == {"value": None, "enforced_by": "none"}
    assert limits["memory"]["enforced_by"] in ("rlimit", "cgroup-v1", "cgroup-v2")
    if os.geteuid() != 0:
        # No delegated cgroup for an ordinary user unless --cgroup is given.
        assert limits["memory"]["enforced_by"] == "rlimit"
        assert limits["pids"]["enforced_by"] == "rlimit"
    assert data["seccomp"] == "default"


def test_unlimited_lifts_a_default(sqbox, busybox_image, tmp_path):
    result, data = run_with_record(sqbox, busybox_image, tmp_path, "sh", "-c", "ulimit -n",
                                   options=["--memory", "unlimited", "--nofile", "unlimited"])
    assert data["limits"]["memory"] == {"value": None, "enforced_by": "none"}
    assert data["limits"]["open_files"] == {"value": None, "enforced_by": "none"}
    assert result.stdout.strip() != "4096"


def test_memory_limit(sqbox, python_image, tmp_path):
    result, data = run_with_record(sqbox, python_image, tmp_path, "python3", "-c",
                                   "x = bytearray(600 * 1024 * 1024)", options=["--memory", "256M"])
    if data["limits"]["memory"]["enforced_by"] == "rlimit":
        assert result.returncode == 1
        assert "MemoryError" in result.stderr
        assert data["oom_killed"] is False
    else:
        # A cgroup limit: the kernel's OOM killer ends it, and sqbox says so.
        assert result.returncode == 128 + signal.SIGKILL
        assert data["oom_killed"] is True
        assert data["signal"] == signal.SIGKILL
        assert "sqbox: out of memory" in result.stderr


def test_oom_kill_is_reported_as_such(sqbox, python_image, tmp_path):
    probe, data = run_with_record(sqbox, python_image, tmp_path, "true")
    if data["limits"]["memory"]["enforced_by"] == "rlimit":
        pytest.skip("needs a cgroup memory controller (root, or --cgroup with a delegated "
                    "cgroup v2); this user gets RLIMIT_DATA, which fails allocations instead")
    script = "x = []\nwhile True: x.append(bytearray(16 << 20))"
    result, data = run_with_record(sqbox, python_image, tmp_path, "python3", "-c", script,
                                   options=["--memory", "128M"])
    assert data["oom_killed"] is True
    assert result.returncode == 137
    assert result.stderr.count("sqbox: out of memory") == 1


def test_pids_limit(sqbox, python_image, tmp_path):
    script = ("import os\n"
              "children = 0\n"
              "try:\n"
              "    for _ in range(50):\n"
              "        if os.fork() == 0:\n"
              "            import time; time.sleep(30); os._exit(0)\n"
              "        children += 1\n"
              "except BlockingIOError:\n"
              "    print('limited at', children)\n")
    result, data = run_with_record(sqbox, python_image, tmp_path, "python3", "-c", script,
                                   options=["--pids", "8"], timeout=60)
    if data["limits"]["pids"]["enforced_by"] == "none":
        assert os.geteuid() == 0
        pytest.skip("host root without a cgroup pids controller: RLIMIT_NPROC does not bind "
                    "uid 0 (the record says so)")
    assert result.stdout.startswith("limited at")
    assert int(result.stdout.split()[-1]) < 8


def test_the_payload_sees_its_own_cgroup_as_the_root(sqbox, busybox_image):
    """The payload's process is started early (while init builds the root), but after init has
    joined the sandbox's cgroup and made a cgroup namespace of it: the payload is in a cgroup
    namespace of its own, where every hierarchy shows "/" and nothing of the caller's tree."""
    result = sqbox.run(busybox_image, "sh", "-c",
                       "readlink /proc/self/ns/cgroup; cat /proc/self/cgroup")
    assert result.returncode == 0, result.stderr
    namespace, *lines = result.stdout.split()
    assert namespace.startswith("cgroup:[") and namespace != os.readlink("/proc/self/ns/cgroup")
    assert lines, result.stdout
    assert all(line.split(":", 2)[2] == "/" for line in lines), result.stdout


def test_cpus_needs_a_cgroup(sqbox, busybox_image, tmp_path):
    result, data = run_with_record(sqbox, busybox_image, tmp_path, "true",
                                   options=["--cpus", "0.5"])
    if os.geteuid() != 0:
        assert result.returncode == 125
        assert result.stderr.startswith("sqbox: --cpus needs a cgroup")
        assert result.stderr.count("\n") == 1
    elif result.returncode == 0:
        assert data["limits"]["cpus"]["value"] == 0.5
        assert data["limits"]["cpus"]["enforced_by"].startswith("cgroup")


@pytest.mark.skipif(os.geteuid() != 0, reason="--cpus needs a cgroup: root, or --cgroup")
def test_cpus_becomes_the_cgroups_quota_rounded_to_the_microsecond(sqbox, busybox_image):
    # 1.2345678 CPUs of 100000 us periods: 123456.78 us, so 123457.
    sandbox = sqbox.popen(busybox_image, "sh", "-c", "echo ready; read x; true",
                          options=["--cpus", "1.2345678", "--timeout", "30"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    try:
        assert sandbox.stdout.readline() == "ready\n", sandbox.stderr.read()
        quotas = {path: path.read_text().split()
                  for directory in sandbox_cgroups_of(sandbox.pid)
                  for path in (Path(directory, "cpu.max"), Path(directory, "cpu.cfs_quota_us"))
                  if path.exists()}
        assert quotas, "no cgroup of the sandbox with a CPU quota under /sys/fs/cgroup"
        for path, quota in quotas.items():
            assert quota[0] == "123457", (path, quota)
            if path.name == "cpu.max":
                assert quota[1] == "100000", (path, quota)
    finally:
        sandbox.stdin.close()
        sandbox.wait(timeout=60)
    assert sandbox.returncode == 0, sandbox.stderr.read()


def test_cgroup_option_rejects_a_directory_that_is_not_a_delegated_cgroup(sqbox, busybox_image,
                                                                          tmp_path):
    result = sqbox.run(busybox_image, "true", options=["--cgroup", str(tmp_path)])
    assert result.returncode == 125
    assert "not a cgroup v2 directory you can write" in result.stderr
    assert result.stderr.count("\n") == 1


def _cgroup2_with(controllers):
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                point = fields[4]
                available = open(os.path.join(point, "cgroup.controllers")).read().split()
                if all(c in available for c in controllers):
                    return point
    return None


def test_delegated_cgroup_v2(sqbox, python_image, tmp_path):
    """--cgroup DIR: the limits go to cgroup v2 files under DIR."""
    point = _cgroup2_with(["memory", "pids"])
    if os.geteuid() != 0 or point is None:
        pytest.skip("needs root to make a delegated cgroup v2 with the memory and pids "
                    "controllers (this host binds them to cgroup v1)" if point is None else
                    "needs root to create the delegated cgroup for the test")
    parent = os.path.join(point, f"sqbox-test-{os.getpid()}")
    os.mkdir(parent)
    try:
        result, data = run_with_record(sqbox, python_image, tmp_path, "python3", "-c",
                                       "x = []\nwhile True: x.append(bytearray(16 << 20))",
                                       options=["--cgroup", parent, "--memory", "128M"])
        assert data["limits"]["memory"]["enforced_by"] == "cgroup-v2"
        assert data["oom_killed"] is True
        assert [d for d in os.listdir(parent) if d.startswith("sqbox-")] == []
    finally:
        os.rmdir(parent)


def test_file_size_limit(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c",
                       "head -c 2000000 /dev/zero > /tmp/f; echo $?; wc -c < /tmp/f",
                       options=["--fsize", "1M"])
    # The writer is stopped by SIGXFSZ at exactly the limit; the sandbox itself ran fine.
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(128 + signal.SIGXFSZ), str(1 << 20)], result.stdout


def test_open_files_limit(sqbox, python_image):
    script = ("import os\n"
              "fds = []\n"
              "try:\n"
              "    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n"
              "except OSError as e:\n"
              "    print(e.errno, len(fds))\n")
    result = sqbox.run(python_image, "python3", "-c", script, options=["--nofile", "20"])
    errno_value, count = result.stdout.split()
    assert errno_value == "24"  # EMFILE
    assert int(count) < 20


def test_core_dumps_are_off(sqbox, busybox_image):
    assert sqbox.run(busybox_image, "sh", "-c", "ulimit -c").stdout == "0\n"

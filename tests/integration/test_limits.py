"""Timeouts and resource limits."""
import json
import os

import pytest
import signal
import time


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


def test_memory_limit(sqbox, python_image):
    result = sqbox.run(python_image, "python3", "-c",
                       "x = bytearray(600 * 1024 * 1024)", options=["--memory", "256M"])
    assert result.returncode == 1
    assert "MemoryError" in result.stderr


def test_pids_limit(sqbox, python_image):
    if os.geteuid() == 0:
        pytest.skip("RLIMIT_NPROC does not bind processes of host root (the kernel exempts "
                    "uid 0); checked in the unprivileged pass")
    script = ("import os\n"
              "children = 0\n"
              "try:\n"
              "    for _ in range(50):\n"
              "        if os.fork() == 0:\n"
              "            import time; time.sleep(30); os._exit(0)\n"
              "        children += 1\n"
              "except BlockingIOError:\n"
              "    print('limited at', children)\n")
    result = sqbox.run(python_image, "python3", "-c", script, options=["--pids", "8"],
                       timeout=60)
    assert result.stdout.startswith("limited at")
    assert int(result.stdout.split()[-1]) < 8


def test_file_size_limit(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "head -c 2000000 /dev/zero > /tmp/f",
                       options=["--fsize", "1M"])
    assert result.returncode != 0


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

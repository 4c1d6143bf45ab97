"""--seccomp: the built-in profiles, Docker's own profile file, `sqbox seccomp check`."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def docker_profile():
    """Docker's default profile: a real third-party file kept beside the checkout."""
    base = os.environ.get("SQBOX_TESTDATA_DIR", str(ROOT.parent / "shared" / "testdata"))
    path = Path(base) / "docker-default-seccomp.json"
    if not path.is_file():
        pytest.skip(f"Docker's default seccomp profile not found at {path} "
                    "(set SQBOX_TESTDATA_DIR)")
    return str(path)


def test_python_runs_under_dockers_own_profile(sqbox, python_image, tmp_path):
    record = tmp_path / "r.json"
    script = ("import subprocess, threading, socket, ctypes\n"
              "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
              "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout,"
              " end='')\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.close()\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "print('setns', libc.setns(0, 0), ctypes.get_errno())\n")
    result = sqbox.run(python_image, "python3", "-c", script,
                       options=["--seccomp", docker_profile(), "--json", str(record)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "child\nsetns -1 1\n"  # Docker's default answer is EPERM
    assert json.loads(record.read_text())["seccomp"] == docker_profile()


def test_check_accepts_the_shipped_and_dockers_profiles(sqbox_bin):
    for profile in ("default", "strict", docker_profile()):
        result = subprocess.run([sqbox_bin, "seccomp", "check", profile], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.rstrip().endswith(": ok")


def test_check_reports_unknown_names_with_their_line(sqbox_bin, tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text('{"defaultAction": "SCMP_ACT_ERRNO",\n'
                       ' "syscalls": [{"names": ["read",\n "opne"], "action": "SCMP_ACT_ALLOW"}]}\n')
    result = subprocess.run([sqbox_bin, "seccomp", "check", str(profile)], capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert result.stderr == f"{profile}:3: unknown system call 'opne' (libseccomp does not know " \
                            "it; the name is skipped)\n"


def test_check_rejects_a_bad_action_with_its_line(sqbox_bin, tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text('{"defaultAction": "SCMP_ACT_ERRNO",\n "syscalls": [\n'
                       '  {"names": ["read"], "action": "SCMP_ACT_MAYBE"}]}\n')
    result = subprocess.run([sqbox_bin, "seccomp", "check", str(profile)], capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert result.stderr == (f"sqbox: {profile}:3: syscalls[0].action: unknown action "
                             "'SCMP_ACT_MAYBE'\n")


def test_run_with_a_broken_profile_fails_before_anything_starts(sqbox, busybox_image, tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text('{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": 3}')
    result = sqbox.run(busybox_image, "echo", "never", options=["--seccomp", str(profile)])
    assert result.returncode == 125
    assert result.stdout == ""
    assert result.stderr == f"sqbox: --seccomp {profile}:1: syscalls: expected a list\n"


def test_seccomp_none_warns(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "grep", "Seccomp:", "/proc/self/status",
                       options=["--seccomp", "none"])
    assert result.returncode == 0
    assert result.stdout.split() == ["Seccomp:", "0"]
    assert result.stderr.startswith("sqbox: warning: --seccomp none")


def test_default_profile_is_in_force(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "grep", "Seccomp:", "/proc/self/status")
    assert result.stdout.split() == ["Seccomp:", "2"]

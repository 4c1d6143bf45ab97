"""Escape tests: hostile payloads run inside the sandbox, and checks that the host did not change.

Every test runs its attack as the payload of a real `sqbox run` and asserts that the attack
failed (with the errno the threat model predicts where one is predictable). An autouse fixture
then checks the host: the sentinel directory is unchanged, the host `sleep` process is alive,
and no process whose command line holds the test's unique marker (every payload's argv carries
it, and so do sqbox's own processes, which share the launcher's argv) is left behind.

Run as root and as an unprivileged user (scripts/test does both); nothing here depends on the
test directory's location beyond reading the attack sources next to this file and the helpers
the suites share in ../support.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from escape_support import (GRACE, PRELUDE, SANDBOX_TIMEOUT, parse_attack_lines, parse_results,
                            tree_digest)

# The helpers the suites share (tests/support), found beside this suite wherever it runs.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import test_inputs  # noqa: E402  (needs the path above)
from host_processes import wait_until_gone  # noqa: E402  (needs the path above)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sqbox-security")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def sqbox_bin(session_dir):
    """A private copy of the binary: the tests hash it, and a rebuild going on beside the test
    run must not look like an attack (nor pull the binary away mid-run)."""
    source = test_inputs.sqbox_binary()
    deadline = time.monotonic() + 60
    while not os.access(source, os.X_OK) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert os.access(source, os.X_OK), f"sqbox binary not found at {source}; build first"
    copy = session_dir / "bin" / "sqbox"
    copy.parent.mkdir()
    copy.parent.chmod(0o755)
    for _ in range(20):  # a rebuild may be rewriting the source right now: retry until it runs
        shutil.copyfile(source, copy)
        copy.chmod(0o755)
        if subprocess.run([str(copy), "--version"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=30).returncode == 0:
            break
        time.sleep(0.5)
    return str(copy)


@pytest.fixture(scope="session")
def python_image():
    return test_inputs.image("python")


@pytest.fixture(scope="session")
def busybox_image():
    return test_inputs.image("busybox")


@pytest.fixture(scope="session")
def attacks_dir(session_dir):
    """The C attack programs, compiled statically, in a directory the payload gets read-only."""
    out = session_dir / "attacks"
    out.mkdir()
    for name in ("attack", "setuid_probe"):
        source = HERE / "attacks" / f"{name}.c"
        result = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(out / name),
                                 str(source)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=120)
        assert result.returncode == 0, f"cannot compile {source}:\n{result.stdout}"
    for entry in [out, *out.iterdir()]:
        entry.chmod(0o755)
    return out


@pytest.fixture(scope="session")
def busybox_rootfs(session_dir, busybox_image):
    """The busybox image unpacked once; tests copy it to build hostile directory images."""
    rootfs = session_dir / "busybox-rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    return rootfs


class HostSentinel:
    def __init__(self, path, secret):
        self.dir = path
        self.file = path / "secret.txt"
        self.secret = secret


@pytest.fixture(scope="session")
def host_sentinel(session_dir):
    """A host directory with a secret file: readable by the caller, so by the sandbox user if it
    could reach it, and never mounted into any sandbox."""
    path = session_dir / "host-sentinel"
    path.mkdir()
    path.chmod(0o777)
    secret = "HOST-SECRET-" + uuid.uuid4().hex
    (path / "secret.txt").write_text(secret + "\n")
    (path / "secret.txt").chmod(0o666)
    (path / "subdir").mkdir()
    (path / "subdir").chmod(0o777)
    return HostSentinel(path, secret)


@pytest.fixture(scope="session")
def host_sleeper():
    """A host process the payloads try to see, signal and trace."""
    proc = subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait()


class Box:
    """Runs payloads in sqbox. Every call carries the test's marker in the payload's argv and a
    --timeout (SANDBOX_TIMEOUT unless the options name one)."""

    def __init__(self, binary, python_image, busybox_image, marker, attacks_dir_getter):
        self.binary = binary
        self.python_image = python_image
        self.busybox_image = busybox_image
        self.marker = marker
        self._attacks_dir_getter = attacks_dir_getter

    @property
    def attacks_dir(self):
        return self._attacks_dir_getter()

    def argv(self, image, command, options=()):
        options = list(options)
        if "--timeout" not in options:
            options = ["--timeout", str(SANDBOX_TIMEOUT)] + options
        return [self.binary, "run", *options, image, "--", *command]

    def run(self, image, *command, options=(), timeout=None, **kwargs):
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        if kwargs.get("input") is None and "stdin" not in kwargs:
            kwargs["stdin"] = subprocess.DEVNULL
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(image, command, options),
                              timeout=timeout or SANDBOX_TIMEOUT + GRACE, **kwargs)

    def py(self, script, *args, options=(), helpers="", **kwargs):
        """Runs a Python attack script (PRELUDE + helpers + script) in the python image."""
        source = PRELUDE + textwrap.dedent(helpers) + textwrap.dedent(script)
        return self.run(self.python_image, "python3", "-c", source, self.marker,
                        *[str(a) for a in args], options=options, **kwargs)

    def py_results(self, script, *args, options=(), helpers="", **kwargs):
        result = self.py(script, *args, options=options, helpers=helpers, **kwargs)
        results = parse_results(result.stdout)
        assert results is not None, (
            f"payload did not finish (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result, results

    def sh(self, script, *args, image=None, options=(), **kwargs):
        return self.run(image or self.busybox_image, "sh", "-c", script, self.marker,
                        *[str(a) for a in args], options=options, **kwargs)

    def attack(self, subcommand, options=(), **kwargs):
        """Runs attacks/attack.c's SUBCOMMAND; returns (CompletedProcess, {name: (ret, errno)})."""
        attacks = self.attacks_dir
        result = self.run(self.python_image, "/attacks/attack", self.marker, subcommand,
                          options=["--mount", f"{attacks}:/attacks:ro", *options], **kwargs)
        return result, parse_attack_lines(result.stdout)


@pytest.fixture
def marker():
    return "sqbox-sec-" + uuid.uuid4().hex


@pytest.fixture(autouse=True)
def host_is_unchanged(marker, host_sentinel, host_sleeper):
    """After every test: the sentinel directory is as it was, the host sleeper lives, and no
    process carrying the test's marker is left."""
    before = tree_digest(host_sentinel.dir)
    assert host_sleeper.poll() is None, "host sleeper died before the test"
    yield
    left = wait_until_gone(marker)
    for pid in left:  # clean up so one failure does not cascade, then report it
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert left == [], f"sandbox processes left behind: {left}"
    assert host_sleeper.poll() is None, "the host sleeper was killed"
    os.kill(host_sleeper.pid, 0)
    assert tree_digest(host_sentinel.dir) == before, "the host sentinel directory changed"


@pytest.fixture
def box(sqbox_bin, python_image, busybox_image, marker, request):
    return Box(sqbox_bin, python_image, busybox_image, marker,
               lambda: request.getfixturevalue("attacks_dir"))

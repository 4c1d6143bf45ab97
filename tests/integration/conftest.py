"""Shared fixtures: the real sqbox binary and real images, run as whoever runs pytest.

scripts/test runs this suite twice when started as root: once as root and once as an
unprivileged user created for the purpose.
"""
import subprocess
import sys
from pathlib import Path

import pytest

# The helpers the suites share (tests/support), found beside this suite wherever it runs.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import test_inputs  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def sqbox_bin():
    return test_inputs.executable_sqbox_binary()


@pytest.fixture(scope="session")
def busybox_image():
    return test_inputs.image("busybox")


@pytest.fixture(scope="session")
def python_image():
    return test_inputs.image("python")


class Sqbox:
    def __init__(self, binary):
        self.binary = binary

    def run(self, image, *command, options=(), input=None, timeout=60, env=None, text=True,
            pass_fds=()):
        """Runs `sqbox run [options] image -- command...` and returns the CompletedProcess."""
        argv = [self.binary, "run", *options, image, "--", *command]
        return subprocess.run(argv, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, env=env, text=text, pass_fds=pass_fds)

    def popen(self, image, *command, options=(), **kwargs):
        argv = [self.binary, "run", *options, image, "--", *command]
        return subprocess.Popen(argv, **kwargs)


@pytest.fixture(scope="session")
def sqbox(sqbox_bin):
    return Sqbox(sqbox_bin)

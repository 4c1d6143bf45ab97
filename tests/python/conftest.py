"""Fixtures for the Python client tests: the REAL sqbox binary and the REAL Python image.

`$SQBOX_BIN` (default <repo>/build/sqbox) and `$SQBOX_PYTHON_IMAGE` (default: whatever
`images/build python` prints) select them. The client package is imported from <repo>/python
without being installed.
"""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
# The helpers the suites share (tests/support), found beside this suite wherever it runs.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import sqbox  # noqa: E402  (needs the path above)
import test_inputs  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def sqbox_bin():
    return test_inputs.executable_sqbox_binary()


@pytest.fixture(scope="session")
def python_image():
    return test_inputs.image("python")


@pytest.fixture(scope="module")
def sandbox(sqbox_bin, python_image):
    """One server shared by the tests of a module (each test makes its own sessions)."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin) as box:
        yield box


@pytest.fixture
def session(sandbox):
    with sandbox.session(timeout=30) as sess:
        yield sess

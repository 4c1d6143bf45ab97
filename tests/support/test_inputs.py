"""What every suite runs: the sqbox binary and the test images, from the environment that
scripts/test sets, or else from the checkout.

Shared by the integration, escape and client suites: each suite's conftest.py puts this
directory on sys.path.
"""
import os
import subprocess
from pathlib import Path

# The checkout (or scripts/test's staged copy of it).
ROOT = Path(__file__).resolve().parents[2]


def sqbox_binary():
    """$SQBOX_BIN, else the checkout's build/sqbox (not checked: callers decide how to wait)."""
    return os.environ.get("SQBOX_BIN", str(ROOT / "build" / "sqbox"))


def executable_sqbox_binary():
    path = sqbox_binary()
    assert os.access(path, os.X_OK), f"sqbox binary not found at {path}; build first"
    return path


def image(name):
    """$SQBOX_<NAME>_IMAGE, else what `images/build NAME` builds (once, cached)."""
    env_name = f"SQBOX_{name.upper()}_IMAGE"
    path = os.environ.get(env_name)
    if not path:
        path = subprocess.run([str(ROOT / "images" / "build"), name], check=True,
                              stdout=subprocess.PIPE, text=True).stdout.strip()
    assert Path(path).is_file(), f"{env_name}: {path} missing"
    return path

"""The client alone (`pip install ./python`: pure Python, no `sqbox` command), or, when a copy of
this directory has the binary at sqbox/_bin/sqbox, the platform wheel that carries it: tagged
py3-none-$SQBOX_WHEEL_PLATFORM (the glibc and architecture the binary needs) and with a `sqbox`
command that starts it. scripts/package --wheel stages that copy and builds it; the rest of the
metadata is pyproject.toml's either way.
"""
import os
from pathlib import Path

from setuptools import setup

# pyproject.toml declares the scripts dynamic: they are set here, empty without a binary.
options = {"entry_points": {}}
if (Path(__file__).resolve().parent / "sqbox" / "_bin" / "sqbox").exists():
    platform = os.environ.get("SQBOX_WHEEL_PLATFORM")
    if not platform:
        raise SystemExit("setup.py: sqbox/_bin/sqbox needs a platform tag in "
                         "$SQBOX_WHEEL_PLATFORM; build the wheel with scripts/package --wheel")
    from wheel.bdist_wheel import bdist_wheel

    class BinaryWheel(bdist_wheel):
        """For one platform and any Python 3: the package is Python, the binary it carries is a
        program rather than an extension module."""

        def get_tag(self):
            return "py3", "none", platform

    options = {
        "cmdclass": {"bdist_wheel": BinaryWheel},
        "entry_points": {"console_scripts": ["sqbox = sqbox._command:main"]},
    }

setup(**options)

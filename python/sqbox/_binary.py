"""Locating the sqbox binary."""
from __future__ import annotations

import os
import shutil
from typing import Optional, Union

from ._errors import SqboxError

PathLike = Union[str, "os.PathLike[str]"]

# Where the platform wheel (scripts/package --wheel) puts the binary; a client installed from
# the source tree (`pip install ./python`) has none there.
BUNDLED_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "sqbox")


def find_binary(binary: Optional[PathLike] = None) -> str:
    """Return the path of the sqbox binary to use.

    In order: the explicit `binary` argument, `$SQBOX_BIN`, the binary bundled with this
    package (the platform wheel), then `sqbox` on `$PATH`. Raises `SqboxError` when none of them
    names an executable file.
    """
    if binary is not None:
        return _check(os.fspath(binary), "binary= argument")
    from_env = os.environ.get("SQBOX_BIN")
    if from_env:
        return _check(from_env, "$SQBOX_BIN")
    bundled = bundled_binary()
    if bundled:
        return bundled
    found = shutil.which("sqbox")
    if found:
        return found
    raise SqboxError("cannot find the sqbox binary: pass binary=..., set $SQBOX_BIN, "
                     "install the sqbox wheel that carries it, or put sqbox on $PATH")


def bundled_binary() -> Optional[str]:
    """The binary this package carries, or None when it carries none. One that is there but
    not executable is a broken install, reported rather than passed over for another."""
    if not os.path.lexists(BUNDLED_BINARY):
        return None
    return _check(BUNDLED_BINARY, "this package")


def _check(path: str, origin: str) -> str:
    # A bare name ("sqbox") is looked up on $PATH like a shell would.
    if os.sep not in path:
        found = shutil.which(path)
        if found:
            return found
    elif os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    raise SqboxError(f"sqbox binary from {origin} is not an executable file: {path}")

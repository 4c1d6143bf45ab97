"""Locating the sqbox binary."""
from __future__ import annotations

import os
import shutil
from typing import Optional, Union

from ._errors import SqboxError

PathLike = Union[str, "os.PathLike[str]"]


def find_binary(binary: Optional[PathLike] = None) -> str:
    """Return the path of the sqbox binary to use.

    In order: the explicit `binary` argument, `$SQBOX_BIN`, then `sqbox` on `$PATH`.
    Raises `SqboxError` when none of them names an executable file.
    """
    if binary is not None:
        return _check(os.fspath(binary), "binary= argument")
    from_env = os.environ.get("SQBOX_BIN")
    if from_env:
        return _check(from_env, "$SQBOX_BIN")
    found = shutil.which("sqbox")
    if found:
        return found
    raise SqboxError("cannot find the sqbox binary: pass binary=..., set $SQBOX_BIN, "
                     "or put sqbox on $PATH")


def _check(path: str, origin: str) -> str:
    # A bare name ("sqbox") is looked up on $PATH like a shell would.
    if os.sep not in path:
        found = shutil.which(path)
        if found:
            return found
    elif os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    raise SqboxError(f"sqbox binary from {origin} is not an executable file: {path}")

"""The `sqbox` command of the platform wheel: the bundled binary, started in place of Python."""
from __future__ import annotations

import os
import signal
import sys

from ._binary import bundled_binary
from ._errors import SqboxError


def main() -> None:
    try:
        binary = bundled_binary()
    except SqboxError as error:
        sys.exit(f"sqbox: {error}")
    if binary is None:
        sys.exit("sqbox: this installation of the sqbox package carries no binary "
                 "(install the platform wheel, or put sqbox on $PATH)")
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, so they
    # go back to the defaults first, as the binary started from a shell would have them.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    # argv[0] as the caller gave it: the binary speaks enroot's command line when its name is
    # `enroot` (a link to this command named so).
    os.execv(binary, [sys.argv[0], *sys.argv[1:]])

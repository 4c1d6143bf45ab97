"""Exceptions raised by the sqbox client."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # only for annotations; avoids an import cycle
    from ._results import ExecError, ExecResult


class SqboxError(Exception):
    """sqbox itself failed (bad image, bad option, the server died, ...).

    Not raised when the sandboxed program merely fails: that is reported in the result.
    `stderr` holds what sqbox wrote on its stderr, when there is any.
    """

    def __init__(self, message: str, stderr: str = "") -> None:
        if stderr and not _says_nothing_new(stderr, message):
            message = f"{message}\n--- sqbox stderr ---\n{stderr.rstrip()}"
        super().__init__(message)
        self.stderr = stderr


class SessionDead(SqboxError):
    """The session's interpreter is gone (it crashed, or ignored a timeout interrupt).

    Every later request on the session raises this until `reset()` or `close()`.
    """


class ProtocolError(SqboxError):
    """A reply did not have the form the protocol gives it (a field missing or of the wrong
    type). The server's own replies always have it; a session's code can forge the reply to the
    request it runs in (SECURITY.md), so replies of sessions are checked field by field. A
    malformed `execute()` reply becomes an `ExecResult` whose error has the type "ProtocolError"
    instead; `get()`, `put()`, `reset()` and the other calls raise this.
    """


class SandboxExecError(Exception):
    """Code run in a session raised an exception; raised by `ExecResult.raise_for_error()`.

    This is the payload's failure, not sqbox's, so it is not a `SqboxError`.
    """

    def __init__(self, error: "ExecError", result: Optional["ExecResult"] = None) -> None:
        text = f"{error.type}: {error.message}"
        if error.traceback:
            text = f"{text}\n{error.traceback.rstrip()}"
        super().__init__(text)
        self.error = error
        self.result = result
        self.type = error.type
        self.message = error.message
        self.traceback = error.traceback


def _says_nothing_new(stderr: str, message: str) -> bool:
    """True when every line of stderr (less its "sqbox: " prefix) is already in message."""
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("sqbox: "):
            line = line[len("sqbox: "):]
        if line and line not in message:
            return False
    return True

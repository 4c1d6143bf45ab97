"""Result types returned by the sqbox client."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from ._display import DisplayData
from ._errors import SandboxExecError


@dataclass(frozen=True)
class Result:
    """How a command run in a fresh sandbox ended.

    `exit_code` follows `sqbox run`: the command's own status, 128+N when killed by signal N,
    124 on timeout, 126/127 when the command could not be executed or found.
    `stdout`/`stderr` are decoded as UTF-8 with invalid bytes replaced; the exact bytes are in
    `stdout_bytes`/`stderr_bytes`.
    """

    exit_code: int
    signal: Optional[int]
    timed_out: bool
    oom_killed: bool
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(repr=False)
    stderr_bytes: bytes = field(repr=False)
    stdout_truncated: bool
    stderr_truncated: bool
    wall_ms: float
    cpu_ms: float
    # run_python: served by an interpreter started (and its preload imported) before the call.
    prestarted: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 within its time limit."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ExecError:
    """An exception raised by code run in a session."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class ExecResult:
    """The outcome of `Session.execute()`.

    `value` is the repr of the code's trailing expression (None if there is none);
    `error` is set when the code raised (including the interrupt of a timeout). `display` holds
    what the code displayed (`display(obj)`, or a trailing value with `_repr_png_`,
    `_repr_html_`, ...), in order.
    """

    stdout: str
    stderr: str
    value: Optional[str]
    error: Optional[ExecError]
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    display: Tuple[DisplayData, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the code ran to completion without raising."""
        return self.error is None and not self.timed_out

    def raise_for_error(self) -> "ExecResult":
        """Raise `SandboxExecError` if the code raised; otherwise return self."""
        if self.error is not None:
            raise SandboxExecError(self.error, self)
        return self

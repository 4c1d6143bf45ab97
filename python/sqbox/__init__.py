"""Python client for sqbox, a rootless Linux sandbox that runs commands from squashfs images.

- `run(image, cmd)`: one command in a fresh sandbox (`sqbox run`).
- `Sandbox(image)`: a `sqbox serve` server for many runs and persistent Python `Session`s,
  usable from many threads; `AsyncSandbox`/`AsyncSession` are the asyncio equivalents.

The binary is the `binary=` argument, else `$SQBOX_BIN`, else the one the platform wheel bundles,
else `sqbox` on `$PATH`.
"""
from ._aio import AsyncSandbox, AsyncSession
from ._binary import find_binary
from ._display import DisplayData
from ._errors import ProtocolError, SandboxExecError, SessionDead, SqboxError
from ._processes import AsyncBackgroundProcess, BackgroundProcess, ProcessOutput
from ._results import ExecError, ExecResult, Result
from ._shell import AsyncShellSession, ShellResult, ShellSession
from ._sync import Sandbox, Session, run
from ._transfer import Transfer

__version__ = "0.1.0"

__all__ = [
    "AsyncBackgroundProcess",
    "AsyncSandbox",
    "AsyncSession",
    "AsyncShellSession",
    "BackgroundProcess",
    "DisplayData",
    "ExecError",
    "ExecResult",
    "ProcessOutput",
    "ProtocolError",
    "Result",
    "Sandbox",
    "SandboxExecError",
    "Session",
    "SessionDead",
    "ShellResult",
    "ShellSession",
    "SqboxError",
    "Transfer",
    "find_binary",
    "run",
]

"""torchforge's coder actor on sqbox: model-written Python run in a sandbox, under Monarch.

`SandboxedPythonCoder` has the endpoints of torchforge's `SandboxedPythonCoder`
(`src/forge/actors/coder.py` in meta-pytorch/torchforge): `setup()`, then
`execute(code) -> (stdout, stderr)` as often as needed, and `recreate()` for a clean
environment; `reset()` is the same as `recreate()`, and `close()` stops the server. torchforge's
actor runs `enroot` commands (and works unchanged with sqbox's enroot front end, `sqbox enroot`);
this one keeps one `sqbox serve` server and one session per actor instead, so that an execute
costs no container start. Unlike torchforge's, which runs every `execute` as a new script, the
session keeps its state between calls, as a notebook does, until `recreate()`.

With Monarch installed the class is a Monarch `Actor` and its methods are endpoints (spawn it
with `proc_mesh.spawn("coder", SandboxedPythonCoder, image)`); without it, a plain asyncio
object with the same coroutine methods.
"""
from __future__ import annotations

from typing import Optional, Tuple

import sqbox

try:  # Monarch is optional: the actor works the same as a plain object.
    from monarch.actor import Actor, endpoint
except ImportError:
    class Actor:  # type: ignore[no-redef]
        """Stand-in base class when Monarch is not installed."""

    def endpoint(fn):  # type: ignore[no-redef]
        return fn

__all__ = ["SandboxedPythonCoder"]


class SandboxedPythonCoder(Actor):
    """Executes Python code in a persistent, isolated sqbox session.

    `image` is a squashfs image with python3; `timeout` bounds every `execute` (seconds);
    `memory` caps the session's sandbox (e.g. "1G").
    """

    def __init__(self, image: str, *, timeout: float = 30.0, memory: Optional[str] = None,
                 binary: Optional[str] = None) -> None:
        self.image = image
        self.timeout = timeout
        self.memory = memory
        self.binary = binary
        self._sandbox: Optional[sqbox.AsyncSandbox] = None
        self._session: Optional[sqbox.AsyncSession] = None

    @endpoint
    async def setup(self) -> None:
        """Start the sqbox server and open the session."""
        if self._sandbox is not None:
            raise RuntimeError("setup() was already called")
        sandbox = sqbox.AsyncSandbox(self.image, binary=self.binary, timeout=self.timeout)
        await sandbox.start()
        try:
            self._session = await sandbox.session(memory=self.memory)
        except BaseException:
            await sandbox.aclose()
            raise
        self._sandbox = sandbox

    @endpoint
    async def execute(self, code: str) -> Tuple[str, str]:
        """Run `code`; returns (stdout, stderr). An exception's traceback ends up in stderr.

        A crashed interpreter is replaced by a fresh one (its state is lost; stderr says so).
        """
        session = self._require_session()
        try:
            result = await session.execute(code)
        except sqbox.SessionDead as exc:
            await session.reset()
            return "", f"the interpreter died and was restarted: {exc}\n"
        stderr = result.stderr
        if result.timed_out:
            stderr += f"TimeoutError: execution exceeded {self.timeout} s\n"
        elif result.error is not None:
            stderr += result.error.traceback or f"{result.error.type}: {result.error.message}\n"
        return result.stdout, stderr

    @endpoint
    async def recreate(self) -> None:
        """Forget all state: a fresh interpreter in a fresh sandbox (torchforge's name)."""
        await self._require_session().reset()

    @endpoint
    async def reset(self) -> None:
        """The same as `recreate()`."""
        await self._require_session().reset()

    @endpoint
    async def close(self) -> None:
        """Stop the session and the server; `setup()` may be called again afterwards."""
        sandbox, self._sandbox, self._session = self._sandbox, None, None
        if sandbox is not None:
            await sandbox.aclose()

    def _require_session(self) -> sqbox.AsyncSession:
        if self._session is None:
            raise RuntimeError("call setup() first")
        return self._session

"""A torchforge/Monarch-style coder actor that runs model-written Python in sqbox.

`SandboxedPythonCoder` has the shape of torchforge's coder actor: `setup()`, then
`execute(code) -> (stdout, stderr)` as often as needed (state persists between calls, as in a
notebook), `reset()` for a fresh interpreter, `close()` at the end. Under Monarch the methods
are endpoints of an Actor; without Monarch installed the class is a plain asyncio object.

Run the demo:  SQBOX_BIN=build/sqbox python3 python/examples/sandboxed_python_coder.py [IMAGE]
(IMAGE defaults to $SQBOX_PYTHON_IMAGE).
"""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Optional, Tuple

import sqbox

try:  # Monarch is optional: the actor works the same as a plain object.
    from monarch.actor import Actor, endpoint
except ImportError:
    class Actor:  # type: ignore[no-redef]
        """Stand-in base class when Monarch is not installed."""

    def endpoint(fn):  # type: ignore[no-redef]
        return fn


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
        self._sandbox = await sqbox.AsyncSandbox(self.image, binary=self.binary,
                                                 timeout=self.timeout).start()
        self._session = await self._sandbox.session(memory=self.memory)

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
    async def reset(self) -> None:
        """Forget all state: a fresh interpreter in a fresh sandbox."""
        await self._require_session().reset()

    @endpoint
    async def close(self) -> None:
        """Stop the session and the server."""
        if self._sandbox is not None:
            await self._sandbox.aclose()
        self._sandbox = self._session = None

    def _require_session(self) -> sqbox.AsyncSession:
        if self._session is None:
            raise RuntimeError("call setup() first")
        return self._session


async def demo(image: str) -> None:
    coder = SandboxedPythonCoder(image, timeout=10)
    await coder.setup()
    try:
        out, err = await coder.execute("x = 21\nprint(x * 2)")
        print(f"stdout: {out!r} stderr: {err!r}")
        out, err = await coder.execute("print(x + 1)")  # state persists
        print(f"stdout: {out!r} (x kept)")
        out, err = await coder.execute("1 / 0")
        print("error: " + err.strip().splitlines()[-1])  # ZeroDivisionError: division by zero
        await coder.reset()
        out, err = await coder.execute("print(x)")
        print("after reset: " + err.strip().splitlines()[-1])  # NameError
    finally:
        await coder.close()


if __name__ == "__main__":
    image_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SQBOX_PYTHON_IMAGE")
    if not image_path:
        sys.exit("usage: sandboxed_python_coder.py IMAGE (or set $SQBOX_PYTHON_IMAGE)")
    asyncio.run(demo(image_path))

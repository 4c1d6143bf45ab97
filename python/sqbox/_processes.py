"""Background processes of a session (PROTOCOL.md, "Background processes"): commands started
beside the session's interpreter, in its sandbox (so its code reaches them over loopback), whose
output is read later and which end with the session.

The session serves one request at a time: reading, waiting for or killing a process waits for
an `execute` in progress. `wait()` therefore waits in slices of at most WAIT_SLICE seconds, so
that another thread's request to the same session gets its turn in between.
"""
from __future__ import annotations

import asyncio
import signal as signals
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from . import _protocol as proto
from ._errors import ProtocolError

if TYPE_CHECKING:
    from ._aio import AsyncSession
    from ._sync import Session

WAIT_SLICE = 1.0


@dataclass(frozen=True)
class ProcessOutput:
    """What a background process wrote since the last `read()`, and its state then.

    `exit_code` follows `sqbox run` (128+N when signal N ended it); None while it runs.
    `stdout_pending`/`stderr_pending` count bytes written but beyond this read's limit.
    """

    stdout: str
    stderr: str
    running: bool
    exit_code: Optional[int]
    signal: Optional[int]
    stdout_pending: int = 0
    stderr_pending: int = 0


def start_request(session: str, cmd: proto.Command, env: Optional[Mapping[str, Any]],
                  cwd: Optional[str]) -> Dict[str, Any]:
    request: Dict[str, Any] = {"op": "process_start", "session": session,
                               "command": proto.normalize_command(cmd)}
    env_map = proto.normalize_env(env)
    if env_map:
        request["env"] = env_map
    if cwd is not None:
        request["workdir"] = str(cwd)
    return request


def started(reply: Mapping[str, Any]) -> "tuple[str, int]":
    proto.raise_for_reply(reply, "process_start")
    return proto._field(reply, "process", str), proto._field(reply, "pid", int)


def status(reply: Mapping[str, Any], what: str) -> Dict[str, Any]:
    """The state fields of a process reply, checked (a session's code can forge them)."""
    proto.raise_for_reply(reply, what)
    running = proto._field(reply, "running", bool)
    exit_code = proto._field(reply, "exit_code", (int, type(None)), None)
    if running != (exit_code is None):
        raise ProtocolError(f"malformed reply: running is {running}, exit_code {exit_code}")
    return {"running": running, "exit_code": exit_code,
            "signal": proto._field(reply, "signal", (int, type(None)), None)}


def output(reply: Mapping[str, Any]) -> ProcessOutput:
    state = status(reply, "process_read")
    return ProcessOutput(stdout=proto._field(reply, "stdout", str),
                         stderr=proto._field(reply, "stderr", str),
                         stdout_pending=proto._field(reply, "stdout_pending", int, 0),
                         stderr_pending=proto._field(reply, "stderr_pending", int, 0), **state)


def read_request(session: str, process: str, limit: Optional[int]) -> Dict[str, Any]:
    request: Dict[str, Any] = {"op": "process_read", "session": session, "process": process}
    if limit is not None:
        request["limit"] = int(limit)
    return request


def wait_request(session: str, process: str, seconds: float) -> Dict[str, Any]:
    return {"op": "process_wait", "session": session, "process": process,
            "timeout": max(0.0, seconds)}


def kill_request(session: str, process: str, signal: int) -> Dict[str, Any]:
    return {"op": "process_kill", "session": session, "process": process, "signal": int(signal)}


class BackgroundProcess:
    """A command running in a `Session`'s sandbox; made by `Session.spawn()`."""

    def __init__(self, session: "Session", process_id: str, pid: int) -> None:
        self._session = session
        self.id = process_id
        self.pid = pid  # inside the sandbox
        self.exit_code: Optional[int] = None

    def read(self, limit: Optional[int] = None) -> ProcessOutput:
        """Output written since the last read (at most `limit` bytes of each stream; default
        1 MiB), and whether the process still runs."""
        result = output(self._session._call(read_request(self._session.id, self.id, limit)))
        self.exit_code = result.exit_code
        return result

    def poll(self) -> Optional[int]:
        """The exit code once the process has ended, else None."""
        return self.wait(0)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait for the end (for at most `timeout` s); the exit code, None if it still runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE,
                                                           deadline - time.monotonic())
            state = status(self._session._call(wait_request(self._session.id, self.id, left)),
                           "process_wait")
            if not state["running"] or (deadline is not None and time.monotonic() >= deadline):
                self.exit_code = state["exit_code"]
                return self.exit_code

    def kill(self, signal: int = signals.SIGKILL) -> None:
        """Send `signal` (default SIGKILL) to the process and to its process group."""
        status(self._session._call(kill_request(self._session.id, self.id, signal)),
               "process_kill")

    def __repr__(self) -> str:
        return f"<BackgroundProcess {self.id} pid={self.pid} exit_code={self.exit_code}>"


class AsyncBackgroundProcess:
    """A command running in an `AsyncSession`'s sandbox; made by `AsyncSession.spawn()`."""

    def __init__(self, session: "AsyncSession", process_id: str, pid: int) -> None:
        self._session = session
        self.id = process_id
        self.pid = pid
        self.exit_code: Optional[int] = None

    async def read(self, limit: Optional[int] = None) -> ProcessOutput:
        """As `BackgroundProcess.read`."""
        reply = await self._session._call(read_request(self._session.id, self.id, limit))
        result = output(reply)
        self.exit_code = result.exit_code
        return result

    async def poll(self) -> Optional[int]:
        return await self.wait(0)

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """As `BackgroundProcess.wait`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - loop.time())
            reply = await self._session._call(wait_request(self._session.id, self.id, left))
            state = status(reply, "process_wait")
            if not state["running"] or (deadline is not None and loop.time() >= deadline):
                self.exit_code = state["exit_code"]
                return self.exit_code

    async def kill(self, signal: int = signals.SIGKILL) -> None:
        """As `BackgroundProcess.kill`."""
        reply = await self._session._call(kill_request(self._session.id, self.id, signal))
        status(reply, "process_kill")

    def __repr__(self) -> str:
        return f"<AsyncBackgroundProcess {self.id} pid={self.pid} exit_code={self.exit_code}>"

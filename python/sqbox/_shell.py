"""Shells in a session's sandbox (PROTOCOL.md, "Shells"): `bash` (or `sh` where the image has
none) kept alive between commands, so the working directory, variables and functions persist."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from ._errors import ProtocolError
from ._protocol import raise_for_reply

if TYPE_CHECKING:  # pragma: no cover
    from ._aio import AsyncSession
    from ._sync import Session


@dataclass(frozen=True)
class ShellResult:
    """How one shell command ended. `exit_code` is its status (130 when a timeout interrupted
    it); None if the shell itself ended without one (killed after a timeout it ignored).
    `shell_exited`: the shell is gone (`exit`, or killed); the next command starts a new one."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    shell_exited: bool
    stdout_truncated: bool
    stderr_truncated: bool

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 within its time limit."""
        return self.exit_code == 0 and not self.timed_out


def shell_request(session: str, name: str, command: str, timeout: Optional[float],
                  program: Optional[list]) -> Dict[str, Any]:
    if not isinstance(command, str):
        raise TypeError("a shell command is a string")
    request: Dict[str, Any] = {"op": "shell", "session": session, "name": name,
                               "command": command}
    if timeout is not None:
        request["timeout"] = float(timeout)
    if program is not None:
        request["program"] = [str(arg) for arg in program]
    return request


def shell_result(reply: Mapping[str, Any]) -> ShellResult:
    raise_for_reply(reply, "shell")
    code = reply.get("exit_code")
    fields = {name: reply.get(name, False) for name in
              ("timed_out", "shell_exited", "stdout_truncated", "stderr_truncated")}
    texts = {name: reply.get(name, "") for name in ("stdout", "stderr")}
    if (code is not None and (not isinstance(code, int) or isinstance(code, bool))) or \
            not all(isinstance(value, bool) for value in fields.values()) or \
            not all(isinstance(value, str) for value in texts.values()):
        raise ProtocolError("shell: malformed reply")
    return ShellResult(exit_code=code, **texts, **fields)


class ShellSession:
    """A shell in a session's sandbox; made by `Session.shell()` or `Sandbox.shell()`.

    `run(command)` runs one command (a string, as typed at a prompt) and returns its
    `ShellResult`; commands run one at a time in the same shell. `timeout` (per call, else the
    one given here) interrupts the command as ^C does, then kills what it started.
    """

    def __init__(self, session: "Session", name: str = "main", *,
                 timeout: Optional[float] = None, program: Optional[list] = None,
                 owns_session: bool = False) -> None:
        self._session, self.name = session, name
        self._timeout, self._program, self._owns = timeout, program, owns_session

    @property
    def session(self) -> "Session":
        """The Python session whose sandbox the shell runs in."""
        return self._session

    def run(self, command: str, *, timeout: Optional[float] = None) -> ShellResult:
        request = shell_request(self._session.id, self.name, command,
                                timeout if timeout is not None else self._timeout, self._program)
        return shell_result(self._session._call(request))

    def close(self) -> None:
        """Ends the shell (and, for `Sandbox.shell()`, its session)."""
        if self._session.closed:
            return
        if self._owns:
            self._session.close()
            return
        reply = self._session._call({"op": "shell_close", "session": self._session.id,
                                     "name": self.name})
        raise_for_reply(reply, "shell_close")

    def __enter__(self) -> "ShellSession":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class AsyncShellSession:
    """`ShellSession` for asyncio: `await shell.run(command)`."""

    def __init__(self, session: "AsyncSession", name: str = "main", *,
                 timeout: Optional[float] = None, program: Optional[list] = None,
                 owns_session: bool = False) -> None:
        self._session, self.name = session, name
        self._timeout, self._program, self._owns = timeout, program, owns_session

    @property
    def session(self) -> "AsyncSession":
        return self._session

    async def run(self, command: str, *, timeout: Optional[float] = None) -> ShellResult:
        request = shell_request(self._session.id, self.name, command,
                                timeout if timeout is not None else self._timeout, self._program)
        return shell_result(await self._session._call(request))

    async def aclose(self) -> None:
        if self._session.closed:
            return
        if self._owns:
            await self._session.aclose()
            return
        reply = await self._session._call({"op": "shell_close", "session": self._session.id,
                                           "name": self.name})
        raise_for_reply(reply, "shell_close")

    async def __aenter__(self) -> "AsyncShellSession":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

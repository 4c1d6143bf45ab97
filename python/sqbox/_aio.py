"""The asyncio client: `AsyncSandbox`/`AsyncSession` over `sqbox serve`."""
from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import tempfile
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Set

from . import _processes as processes
from . import _prestart
from . import _protocol as proto
from . import _transfer
from ._processes import AsyncBackgroundProcess
from ._streaming import OutputCallback, OutputEvent, OutputSink, refuse_on_reader
from ._binary import PathLike, find_binary
from ._errors import ProtocolError, SqboxError
from ._protocol import CLOSE_TIMEOUT, Command, MountSpec, Size, Stdin, ToolsArg
from ._results import ExecResult, Result
from ._shell import AsyncShellSession
from ._transfer import Transfer


class AsyncSandbox:
    """A `sqbox serve IMAGE` server for asyncio: runs commands and hosts sessions.

    `async with AsyncSandbox(image) as sandbox:` starts it (or `await sandbox.start()`), and
    `aclose()` shuts it down. Arguments as for `Sandbox`. Any number of coroutines may use it
    at once; one reader task routes the replies.
    """

    def __init__(self, image: PathLike, *, binary: Optional[PathLike] = None,
                 max_parallel: Optional[int] = None, pool: Optional[int] = None,
                 timeout: Optional[float] = None, memory: Optional[Size] = None,
                 mounts: Optional[Iterable[MountSpec]] = None,
                 env: Optional[Mapping[str, Any]] = None, output_limit: Optional[int] = None,
                 extra_args: Sequence[str] = (), start_timeout: float = 60.0,
                 prestart: Optional[int] = None,
                 preload: Optional[Iterable[str]] = None, zygote: bool = False) -> None:
        self.image = os.fspath(image)
        self._defaults = proto.Defaults(timeout=timeout, memory=memory, mounts=mounts, env=env,
                                        output_limit=output_limit)
        self._start_timeout = start_timeout
        self._argv = proto.serve_argv(find_binary(binary), self.image,
                                      max_parallel=max_parallel, pool=pool,
                                      extra_args=[*_prestart.serve_args(prestart, preload, zygote),
                                                  *extra_args])
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._pending: Dict[Any, "asyncio.Future[Dict[str, Any]]"] = {}
        self._sinks: Dict[Any, OutputSink] = {}  # the output callbacks of streaming requests
        self._sessions: Dict[str, AsyncSession] = {}
        self._ids = itertools.count(1)
        self._write_lock: Optional[asyncio.Lock] = None
        self._closed = False
        self._lost: Optional[SqboxError] = None
        self._reader: Optional["asyncio.Task[None]"] = None
        self._stderr_task: Optional["asyncio.Task[None]"] = None
        self._tool_tasks: Set["asyncio.Task[None]"] = set()
        self._stderr = proto.StderrTail()
        self.version = ""

    # -- public API ---------------------------------------------------------------------------

    async def start(self) -> "AsyncSandbox":
        """Start the server and check that it answers; returns self."""
        if self._proc is not None:
            raise SqboxError("the sandbox was already started")
        # Created here, inside the running loop (Python 3.8/3.9 bind locks to a loop at birth).
        self._write_lock = asyncio.Lock()
        # A plain child: if this process dies, the server sees EOF and cleans up after itself.
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=proto.MAX_LINE)
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        self._reader = asyncio.ensure_future(self._read_replies())
        try:
            reply = await self._request({"op": "ping"}, timeout=self._start_timeout)
            self.version = proto.version_from_ping_reply(reply)
        except BaseException:
            await self.aclose()
            raise
        return self

    @property
    def pid(self) -> int:
        """Process id of the `sqbox serve` server."""
        if self._proc is None:
            raise SqboxError("the sandbox is not started")
        return self._proc.pid

    async def ping(self, timeout: Optional[float] = None) -> str:
        """Check that the server answers; returns its version string."""
        reply = await self._request({"op": "ping"}, timeout=timeout)
        return proto.version_from_ping_reply(reply)

    async def run(self, cmd: Command, *, timeout: Optional[float] = None,
                  memory: Optional[Size] = None, mounts: Optional[Iterable[MountSpec]] = None,
                  env: Optional[Mapping[str, Any]] = None, stdin: Stdin = None,
                  output_limit: Optional[int] = None, on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None) -> Result:
        """Run `cmd` in a fresh sandbox and return its `Result` (as `Sandbox.run`).

        `on_stdout`/`on_stderr` may be coroutine functions (awaited on the reader task, so a
        slow one slows the command down) or plain functions (called on the event loop)."""
        sink = OutputSink.wanted(on_stdout, on_stderr)
        request = self._defaults.run_request(cmd, timeout=timeout, memory=memory, mounts=mounts,
                                             env=env, stdin=stdin, output_limit=output_limit,
                                             stream=sink is not None)
        return proto.result_from_reply(await self._request(request, sink=sink))

    async def run_python(self, code: str, *, timeout: Optional[float] = None,
                         memory: Optional[Size] = None,
                         mounts: Optional[Iterable[MountSpec]] = None,
                         env: Optional[Mapping[str, Any]] = None, stdin: Stdin = None,
                         output_limit: Optional[int] = None,
                         cpu_time: Optional[int] = None) -> Result:
        """Run Python `code` once in a never-used sandbox (as `Sandbox.run_python`)."""
        request = _prestart.python_request(
            self._defaults, code, timeout=timeout, memory=memory, mounts=mounts, env=env,
            stdin=stdin, output_limit=output_limit, cpu_time=cpu_time)
        return _prestart.result_from_reply(await self._request(request))

    async def session(self, *, env: Optional[Mapping[str, Any]] = None,
                      mounts: Optional[Iterable[MountSpec]] = None,
                      memory: Optional[Size] = None, tools: ToolsArg = None,
                      timeout: Optional[float] = None,
                      output_limit: Optional[int] = None) -> "AsyncSession":
        """Open an `AsyncSession` (as `Sandbox.session`); tools may be sync or async functions."""
        functions = proto.collect_tools(tools)
        request = self._defaults.session_open_request(env=env, mounts=mounts, memory=memory,
                                                      output_limit=output_limit,
                                                      tools=list(functions))
        reply = await self._request(request)
        session = AsyncSession(self, proto.session_from_open_reply(reply), functions,
                               proto.pick(timeout, self._defaults.timeout))
        self._sessions[session.id] = session
        return session

    async def shell(self, *, timeout: Optional[float] = None,
                    program: Optional[Sequence[str]] = None,
                    **session_options: Any) -> AsyncShellSession:
        """A shell in a sandbox of its own (as `Sandbox.shell`)."""
        session = await self.session(**session_options)
        return AsyncShellSession(session, timeout=timeout,
                                 program=list(program) if program is not None else None,
                                 owns_session=True)

    async def aclose(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Shut the server down, killing every sandbox; waits up to `timeout` s, then kills it."""
        if self._closed:
            return
        self._closed = True
        for session in self._sessions.values():
            session._closed = True
        self._sessions.clear()
        proc = self._proc
        if proc is None:
            return
        try:
            await self._send(proto.encode({"op": "shutdown", "id": "shutdown"}))
        except SqboxError:
            pass
        try:
            proc.stdin.close()  # EOF: the server exits even if it missed the shutdown
        except OSError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        # Bounded, as in the blocking client: the server is gone, so its pipes reach EOF at once
        # unless something else still holds them.
        for task in (self._reader, self._stderr_task):
            if task is not None:
                try:
                    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True),
                                           CLOSE_TIMEOUT)
                except asyncio.TimeoutError:
                    pass  # wait_for cancelled the task
        for task in list(self._tool_tasks):
            task.cancel()

    @property
    def closed(self) -> bool:
        """True once `aclose()` was called."""
        return self._closed

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # -- plumbing -----------------------------------------------------------------------------

    async def _request(self, message: Dict[str, Any], timeout: Optional[float] = None,
                       sink: Optional[OutputSink] = None) -> Dict[str, Any]:
        refuse_on_reader(self._reader is not None and asyncio.current_task() is self._reader)
        self._check_usable()
        request_id = next(self._ids)
        future: "asyncio.Future[Dict[str, Any]]" = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if sink is not None:
            self._sinks[request_id] = sink
        try:
            try:
                await self._send(proto.encode(dict(message, id=request_id)))
            except SqboxError as send_error:
                # As in the blocking client: the reader's connection-lost error says why.
                try:
                    return await asyncio.wait_for(future, proto.LOST_REPORT_WAIT)
                except asyncio.TimeoutError:
                    raise send_error from None
            reply = await (future if timeout is None else asyncio.wait_for(future, timeout))
            if sink is not None:
                await sink.afinish()
            return reply
        except asyncio.TimeoutError:
            raise SqboxError(f"no reply to {message['op']!r} within {timeout} s",
                             stderr=self._stderr_text()) from None
        finally:
            # Also on cancellation: a late reply then finds no taker and is dropped.
            self._pending.pop(request_id, None)
            self._sinks.pop(request_id, None)

    def _check_usable(self) -> None:
        if self._proc is None:
            raise SqboxError("the sandbox is not started (use 'async with' or start())")
        if self._closed:
            raise SqboxError("the sandbox is closed")
        if self._lost is not None:
            raise proto.copy_error(self._lost)

    async def _send(self, line: bytes) -> None:
        assert self._proc is not None and self._write_lock is not None
        # One writer at a time: concurrent drain() calls are not allowed before Python 3.10.
        async with self._write_lock:
            try:
                self._proc.stdin.write(line)
                await self._proc.stdin.drain()
            except (OSError, RuntimeError, AttributeError):  # pipe closed or broken
                raise SqboxError("cannot send to sqbox serve: it has exited",
                                 stderr=self._stderr_text()) from None

    async def _read_replies(self) -> None:
        assert self._proc is not None
        stdout = self._proc.stdout
        try:
            while True:
                line = await stdout.readline()
                if not line:
                    break
                item = proto.classify(line)
                if isinstance(item, proto.ToolCall):
                    self._dispatch_tool_call(item)
                elif isinstance(item, OutputEvent):
                    sink = self._sinks.get(item.id)
                    if sink is not None:
                        await sink.afeed(item)  # awaited here: a slow callback holds the output
                elif isinstance(item, proto.Reply):
                    future = self._pending.pop(item.id, None)
                    if future is not None and not future.done():
                        future.set_result(item.message)
                elif item is not None:
                    self._note_stderr(item)
        except (ValueError, asyncio.LimitOverrunError) as exc:  # a line beyond MAX_LINE
            self._note_stderr(f"sqbox client: {exc}\n".encode())
        finally:
            await self._connection_lost()

    async def _connection_lost(self) -> None:
        assert self._proc is not None
        try:
            await asyncio.wait_for(self._proc.wait(), 5)
        except asyncio.TimeoutError:
            pass
        if self._stderr_task is not None:
            await asyncio.wait([self._stderr_task], timeout=2)
        error = proto.connection_lost_error(self._closed, bool(self.version),
                                            self._proc.returncode, self._stderr_text())
        self._lost = error
        pending = list(self._pending.values())
        self._pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(proto.copy_error(error))

    def _dispatch_tool_call(self, call: proto.ToolCall) -> None:
        session = self._sessions.get(call.session)  # type: ignore[arg-type]
        if session is None:
            coroutine = self._send_quietly(proto.tool_result_message(
                call.session, call.call_id, error=LookupError("no such session")))
        else:
            coroutine = session._answer_tool_call(call)
        # Tools run in their own tasks so the reader keeps routing replies meanwhile.
        task = asyncio.ensure_future(coroutine)
        self._tool_tasks.add(task)
        task.add_done_callback(self._tool_tasks.discard)

    async def _send_quietly(self, line: bytes) -> None:
        try:
            await self._send(line)
        except SqboxError:
            pass

    async def _drain_stderr(self) -> None:
        assert self._proc is not None
        while True:
            chunk = await self._proc.stderr.read(65536)
            if not chunk:
                break
            self._note_stderr(chunk)

    def _note_stderr(self, chunk: bytes) -> None:
        self._stderr.note(chunk)

    def _stderr_text(self) -> str:
        return self._stderr.text()


class AsyncSession:
    """A persistent Python interpreter in its own sandbox; made by `AsyncSandbox.session()`.

    Use as `async with`, or `await aclose()`.
    """

    def __init__(self, sandbox: AsyncSandbox, session_id: str,
                 tools: Dict[str, Callable[..., Any]], timeout: Optional[float]) -> None:
        self._sandbox = sandbox
        self._id = session_id
        self._tools = dict(tools)
        self._timeout = timeout
        self._closed = False

    @property
    def id(self) -> str:
        """The server's id of this session."""
        return self._id

    @property
    def tools(self) -> Dict[str, Callable[..., Any]]:
        """The registered tools, by name (a copy)."""
        return dict(self._tools)

    async def execute(self, code: str, *, timeout: Optional[float] = None,
                      on_stdout: Optional[OutputCallback] = None,
                      on_stderr: Optional[OutputCallback] = None) -> ExecResult:
        """Run `code` in the session's namespace and return its `ExecResult` (as
        `Session.execute`, callbacks as for `AsyncSandbox.run`); raises `SessionDead` if the
        interpreter died."""
        sink = OutputSink.wanted(on_stdout, on_stderr)
        reply = await self._call(proto.exec_request(self._id, code,
                                                    proto.pick(timeout, self._timeout),
                                                    stream=sink is not None), sink=sink)
        return proto.exec_result_from_reply(reply)

    async def spawn(self, cmd: Command, *, env: Optional[Mapping[str, Any]] = None,
                    cwd: Optional[str] = None) -> AsyncBackgroundProcess:
        """Start `cmd` in the background in this session's sandbox (as `Session.spawn`)."""
        reply = await self._call(processes.start_request(self._id, cmd, env, cwd))
        process_id, pid = processes.started(reply)
        return AsyncBackgroundProcess(self, process_id, pid)

    async def put(self, path: str, data: bytes) -> None:
        """Write `data` to the file `path` inside the session's sandbox (at most 64 MiB)."""
        reply = await self._call(proto.put_request(self._id, path, data))
        proto.raise_for_reply(reply, "put")

    async def get(self, path: str) -> bytes:
        """Read the file `path` from inside the session's sandbox (at most 64 MiB)."""
        reply = await self._call({"op": "get", "session": self._id, "path": path})
        return proto.data_from_get_reply(reply)

    async def reset(self) -> None:
        """Replace the interpreter by a fresh one in a fresh sandbox (same id and tools)."""
        proto.raise_for_reply(await self._call({"op": "reset", "session": self._id}), "reset")

    async def upload(self, local: PathLike, remote: str) -> Transfer:
        """Copy a local file or directory into the sandbox (as `Session.upload`)."""
        loop = asyncio.get_running_loop()
        with await loop.run_in_executor(None, _transfer.pack, local) as archive_file:
            return await self.upload_tar(archive_file, remote)

    async def upload_tar(self, archive: Any, remote: str) -> Transfer:
        """Unpack a tar stream beneath a sandbox directory (as `Session.upload_tar`)."""
        loop = asyncio.get_running_loop()
        requests = _transfer.upload_requests(self._id, remote, _transfer.archive_source(archive))
        reply: Dict[str, Any] = {}
        while True:
            request = await loop.run_in_executor(None, next, requests, None)
            if request is None:
                break
            reply = await self._call(request)
            proto.raise_for_reply(reply, "upload")
        return _transfer.upload_result(reply)

    async def download(self, remote: str, local: PathLike) -> Transfer:
        """Copy a sandbox file or directory to a local directory (as `Session.download`)."""
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(None, tempfile.TemporaryFile)
        with stream:
            offset, skipped = 0, []
            while True:
                reply = await self._call(_transfer.download_request(self._id, remote, offset))
                proto.raise_for_reply(reply, "download")
                data, last, names = _transfer.download_chunk(reply)
                await loop.run_in_executor(None, stream.write, data)
                offset, skipped = offset + len(data), skipped + names
                if last:
                    break
                if not data:
                    raise ProtocolError("download: malformed reply: an empty chunk that is not "
                                        "the last")
            stream.seek(0)
            return await loop.run_in_executor(None, _transfer.unpack, stream, local, skipped)

    def shell(self, name: str = "main", *, timeout: Optional[float] = None,
              program: Optional[Sequence[str]] = None) -> AsyncShellSession:
        """A shell beside the interpreter, in the same sandbox (as `Session.shell`)."""
        return AsyncShellSession(self, name, timeout=proto.pick(timeout, self._timeout),
                                 program=list(program) if program is not None else None)

    async def register_tool(self, fn: Callable[..., Any], name: Optional[str] = None,
                            ) -> Callable[..., Any]:
        """Make `fn` (a function or coroutine function) callable inside as `tools.NAME(...)`.

        Sync functions run in the loop's default executor, coroutine functions on the loop.
        Returns `fn`.
        """
        tool = proto.tool_name(fn, name)
        names = dict(self._tools, **{tool: fn})
        # Registered locally first, so a call arriving right after the server knows it works.
        self._tools = names
        reply = await self._call({"op": "tools", "session": self._id, "names": list(names)})
        proto.raise_for_reply(reply, "tools")
        return fn

    async def aclose(self) -> None:
        """Destroy the session's sandbox; closing twice, or after the sandbox closed, is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            # The reply is not checked: a dead or unknown session is as closed as can be.
            await self._sandbox._request({"op": "close", "session": self._id})
        except SqboxError:
            if not (self._sandbox.closed or self._sandbox._lost):
                raise
        finally:
            self._sandbox._sessions.pop(self._id, None)

    @property
    def closed(self) -> bool:
        """True once the session (or its sandbox) was closed."""
        return self._closed

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def _call(self, message: Dict[str, Any], sink: Optional[OutputSink] = None,
                    ) -> Dict[str, Any]:
        if self._closed:
            raise SqboxError(f"session {self._id} is closed")
        return await self._sandbox._request(message, sink=sink)

    async def _answer_tool_call(self, call: proto.ToolCall) -> None:
        fn = self._tools.get(call.name)  # type: ignore[arg-type]
        if fn is None:
            line = proto.tool_result_message(self._id, call.call_id,
                                             error=NameError(f"no tool named {call.name!r}"))
        else:
            try:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*call.args, **call.kwargs)
                else:
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(
                        None, functools.partial(fn, *call.args, **call.kwargs))
                    if inspect.isawaitable(result):  # e.g. a lambda returning a coroutine
                        result = await result
                line = proto.tool_result_message(self._id, call.call_id, result=result)
            except Exception as exc:  # the tool's failure is the sandboxed caller's to handle
                line = proto.tool_result_message(self._id, call.call_id, error=exc)
        await self._sandbox._send_quietly(line)

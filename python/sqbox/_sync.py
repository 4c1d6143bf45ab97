"""The blocking client: one-shot `run`, and `Sandbox`/`Session` over `sqbox serve` (threads)."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence

from . import _prestart
from . import _protocol as proto
from . import _processes as processes
from . import _transfer
from ._processes import BackgroundProcess
from ._streaming import OutputCallback, OutputEvent, OutputSink, refuse_on_reader
from ._binary import PathLike, find_binary
from ._errors import SqboxError
from ._protocol import CLOSE_TIMEOUT, Command, MountSpec, Size, Stdin, ToolsArg
from ._results import ExecResult, Result
from ._shell import ShellSession
from ._transfer import Transfer

# Extra host-side grace beyond a one-shot run's own --timeout before the client gives up on sqbox.
RUN_GRACE = 30.0


def run(image: PathLike, cmd: Command, *, timeout: Optional[float] = None,
        memory: Optional[Size] = None, mounts: Optional[Iterable[MountSpec]] = None,
        env: Optional[Mapping[str, Any]] = None, stdin: Stdin = None, network: bool = False,
        binary: Optional[PathLike] = None, output_limit: Optional[int] = None) -> Result:
    """Run `cmd` once in a fresh sandbox of `image` with `sqbox run` and return its `Result`.

    `cmd` is an argv list, or a string run with `sh -c`. `mounts` are `(src, dst)`,
    `(src, dst, "ro"|"rw")` or `{"source", "target", "read_only"}`; `memory` a byte count or
    a size such as "1G"; `stdin` text or bytes (default: empty). The command failing is
    reported in the result; `SqboxError` means sqbox itself could not run it.
    """
    proto.check_network(network)
    exe = find_binary(binary)
    # The record goes to a private temp file; sqbox opens it before starting the sandbox.
    fd, json_path = tempfile.mkstemp(prefix="sqb-run-", suffix=".json")
    os.close(fd)
    try:
        argv = proto.run_argv(exe, os.fspath(image), cmd, json_path=json_path, timeout=timeout,
                              memory=memory, mounts=mounts, env=env, output_limit=output_limit)
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("stdin must be str, bytes or None")
        host_timeout = None if timeout is None else float(timeout) + RUN_GRACE
        try:
            completed = subprocess.run(
                argv, input=bytes(data) if data is not None else None,
                stdin=subprocess.DEVNULL if data is None else None,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=host_timeout)
        except subprocess.TimeoutExpired as exc:
            raise SqboxError(f"sqbox run did not finish {RUN_GRACE:.0f} s after its timeout",
                             stderr=(exc.stderr or b"").decode("utf-8", "replace")) from None
        stderr_text = completed.stderr.decode("utf-8", "replace")
        try:
            with open(json_path, "rb") as record_file:
                record = json.loads(record_file.read())
        except (OSError, ValueError):
            raise SqboxError(f"sqbox run exited with status {completed.returncode} "
                             f"without a result record", stderr=stderr_text) from None
    finally:
        try:
            os.unlink(json_path)
        except OSError:
            pass
    if completed.returncode < 0:
        raise SqboxError(f"sqbox run was killed by signal {-completed.returncode}",
                         stderr=stderr_text)
    exit_code = int(record.get("exit_code", completed.returncode))
    if exit_code == 125 and record.get("error"):
        raise SqboxError(f"sqbox failed: {record['error']}", stderr=stderr_text)
    return proto.make_result(record, exit_code, completed.stdout, completed.stderr)


def _kill_process(proc: "subprocess.Popen[bytes]") -> None:
    """Last resort when a Sandbox is dropped without close(): no server outlives the client."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class Sandbox:
    """A `sqbox serve IMAGE` server: runs commands and hosts sessions, from many threads.

    Use as a context manager, or call `close()`. `timeout`, `memory`, `mounts`, `env` and
    `output_limit` are defaults for every `run()` and `session()`; per-call arguments override
    them (`env` is merged, `mounts` are added). `max_parallel` and `pool` are passed to the
    server as `--max-parallel`/`--pool`; `extra_args` are any further `sqbox serve` options.
    `prestart` keeps that many Python interpreters started ahead for `run_python`, each having
    imported `preload` (module names; 2 interpreters when only `preload` is given). With
    `zygote`, one warm interpreter that has imported `preload` forks a new sandbox for each
    `run_python` instead (docs/serve.md, "The zygote").
    """

    def __init__(self, image: PathLike, *, binary: Optional[PathLike] = None,
                 max_parallel: Optional[int] = None, pool: Optional[int] = None,
                 timeout: Optional[float] = None, memory: Optional[Size] = None,
                 mounts: Optional[Iterable[MountSpec]] = None,
                 env: Optional[Mapping[str, Any]] = None, output_limit: Optional[int] = None,
                 extra_args: Sequence[str] = (), start_timeout: float = 60.0,
                 tool_workers: int = 32, prestart: Optional[int] = None,
                 preload: Optional[Iterable[str]] = None, zygote: bool = False) -> None:
        self.image = os.fspath(image)
        self._defaults = proto.Defaults(timeout=timeout, memory=memory, mounts=mounts, env=env,
                                        output_limit=output_limit)
        argv = proto.serve_argv(find_binary(binary), self.image, max_parallel=max_parallel,
                                pool=pool,
                                extra_args=[*_prestart.serve_args(prestart, preload, zygote),
                                            *extra_args])

        self._lock = threading.Lock()  # guards _pending, _sessions, _closed, _lost
        self._write_lock = threading.Lock()  # one request line at a time on the pipe
        self._pending: Dict[Any, "Future[Dict[str, Any]]"] = {}
        self._sinks: Dict[Any, OutputSink] = {}  # the output callbacks of streaming requests
        self._sessions: Dict[str, Session] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._lost: Optional[SqboxError] = None
        self._stderr = proto.StderrTail()
        self.version = ""  # the server's, once it has answered

        # Deliberately a plain child (no new session, no daemonizing): if this process dies,
        # the server sees EOF on stdin (and its parent-death signal) and takes its sandboxes down.
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        self._finalizer = weakref.finalize(self, _kill_process, self._proc)
        self._tool_pool = ThreadPoolExecutor(max_workers=tool_workers,
                                             thread_name_prefix="sqbox-tool")
        self._stderr_thread = threading.Thread(target=self._drain_stderr,
                                               name="sqbox-stderr", daemon=True)
        self._reader = threading.Thread(target=self._read_replies, name="sqbox-reader",
                                        daemon=True)
        self._stderr_thread.start()
        self._reader.start()
        try:
            # Fails fast, with the server's own message, on a bad image or option.
            self.version = proto.version_from_ping_reply(
                self._request({"op": "ping"}, timeout=start_timeout))
        except BaseException:
            self.close()
            raise

    # -- public API ---------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """Process id of the `sqbox serve` server."""
        return self._proc.pid

    def ping(self, timeout: Optional[float] = None) -> str:
        """Check that the server answers; returns its version string."""
        reply = self._request({"op": "ping"}, timeout=timeout)
        return proto.version_from_ping_reply(reply)

    def run(self, cmd: Command, *, timeout: Optional[float] = None,
            memory: Optional[Size] = None, mounts: Optional[Iterable[MountSpec]] = None,
            env: Optional[Mapping[str, Any]] = None, stdin: Stdin = None,
            output_limit: Optional[int] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None) -> Result:
        """Run `cmd` in a fresh sandbox (the `run` op) and return its `Result`.

        Arguments as for `sqbox.run`. `on_stdout`/`on_stderr` get the output as it is produced
        (text chunks, up to `output_limit`), on the client's reader thread: a slow callback
        slows the command down rather than letting output pile up; an exception it raises is
        raised here once the command has ended. Safe to call from many threads at once.
        """
        sink = OutputSink.wanted(on_stdout, on_stderr)
        request = self._defaults.run_request(cmd, timeout=timeout, memory=memory, mounts=mounts,
                                             env=env, stdin=stdin, output_limit=output_limit,
                                             stream=sink is not None)
        return proto.result_from_reply(self._request(request, sink=sink))

    def run_python(self, code: str, *, timeout: Optional[float] = None,
                   memory: Optional[Size] = None, mounts: Optional[Iterable[MountSpec]] = None,
                   env: Optional[Mapping[str, Any]] = None, stdin: Stdin = None,
                   output_limit: Optional[int] = None,
                   cpu_time: Optional[int] = None) -> Result:
        """Run Python `code` once, as `python3 -c code` would, in a sandbox nothing else ever
        used, and return its `Result` (as `run`'s; `prestarted` says whether an interpreter
        started ahead served it: with `prestart`, unless the call sets its own `memory`,
        `mounts` or start-up variables such as PYTHONPATH). The fast path for one-shot code.
        """
        request = _prestart.python_request(
            self._defaults, code, timeout=timeout, memory=memory, mounts=mounts, env=env,
            stdin=stdin, output_limit=output_limit, cpu_time=cpu_time)
        return _prestart.result_from_reply(self._request(request))

    def session(self, *, env: Optional[Mapping[str, Any]] = None,
                mounts: Optional[Iterable[MountSpec]] = None, memory: Optional[Size] = None,
                tools: ToolsArg = None, timeout: Optional[float] = None,
                output_limit: Optional[int] = None) -> "Session":
        """Open a `Session`: a Python interpreter that keeps its state between `execute` calls.

        `tools` ({name: callable} or a list of functions) can be called from inside as
        `tools.NAME(...)`; `timeout` is the default for `execute`.
        """
        functions = proto.collect_tools(tools)
        request = self._defaults.session_open_request(env=env, mounts=mounts, memory=memory,
                                                      output_limit=output_limit,
                                                      tools=list(functions))
        reply = self._request(request)
        session = Session(self, proto.session_from_open_reply(reply), functions,
                          proto.pick(timeout, self._defaults.timeout))
        with self._lock:
            self._sessions[session.id] = session
        return session

    def shell(self, *, timeout: Optional[float] = None, program: Optional[Sequence[str]] = None,
              **session_options: Any) -> ShellSession:
        """A shell in a sandbox of its own (a session's, options as for `session()`): `bash`,
        or `sh` where the image has no bash, or `program` (an argv). Closing it closes the
        session. `timeout` is the default of each `run()`."""
        session = self.session(**session_options)
        return ShellSession(session, timeout=timeout,
                            program=list(program) if program is not None else None,
                            owns_session=True)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Shut the server down, killing every sandbox; waits up to `timeout` s, then kills it.

        Pending calls in other threads fail with `SqboxError`. Calling close() again is a no-op.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session._closed = True
        try:
            self._send(proto.encode({"op": "shutdown", "id": "shutdown"}))
        except SqboxError:
            pass  # already gone
        with self._write_lock:
            try:
                self._proc.stdin.close()  # EOF: the server exits even if it missed the shutdown
            except OSError:
                pass
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        # Bounded: the server is gone, so its pipes reach EOF at once unless something else
        # still holds them; then the daemon threads are left to end on their own.
        self._reader.join(timeout=CLOSE_TIMEOUT)
        self._stderr_thread.join(timeout=CLOSE_TIMEOUT)
        if not self._reader.is_alive():
            self._proc.stdout.close()
        if not self._stderr_thread.is_alive():
            self._proc.stderr.close()
        self._finalizer.detach()
        self._tool_pool.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._closed

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _request(self, message: Dict[str, Any], timeout: Optional[float] = None,
                 sink: Optional[OutputSink] = None) -> Dict[str, Any]:
        """Send one request and wait for the reply with its id; its output events, if it asked
        for them, go to `sink` meanwhile."""
        refuse_on_reader(threading.current_thread() is self._reader)
        future: "Future[Dict[str, Any]]" = Future()
        with self._lock:
            self._check_usable()
            request_id = next(self._ids)
            self._pending[request_id] = future
            if sink is not None:
                self._sinks[request_id] = sink
        message = dict(message, id=request_id)
        try:
            try:
                self._send(proto.encode(message))
            except SqboxError as send_error:
                return self._reply_after_failed_send(future, send_error)
            reply = future.result(timeout)
            if sink is not None:
                sink.finish()
            return reply
        except FutureTimeout:
            raise SqboxError(f"no reply to {message['op']!r} within {timeout} s",
                             stderr=self._stderr_text()) from None
        finally:
            # Answered, the reader already took it out; else nobody will answer it now.
            with self._lock:
                self._pending.pop(request_id, None)
                self._sinks.pop(request_id, None)

    @staticmethod
    def _reply_after_failed_send(future: "Future[Dict[str, Any]]",
                                 send_error: SqboxError) -> Dict[str, Any]:
        # The server exited before reading the request. Its stderr may not be drained yet, so
        # the reader's connection-lost error (status and stderr, set on every pending request
        # once the pipes close) says why; the bare send error would not.
        try:
            return future.result(proto.LOST_REPORT_WAIT)
        except FutureTimeout:
            raise send_error from None

    def _check_usable(self) -> None:
        if self._closed:
            raise SqboxError("the sandbox is closed")
        if self._lost is not None:
            raise proto.copy_error(self._lost)

    def _send(self, line: bytes) -> None:
        with self._write_lock:
            try:
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (OSError, ValueError):  # broken pipe, or stdin already closed
                raise SqboxError("cannot send to sqbox serve: it has exited",
                                 stderr=self._stderr_text()) from None

    def _read_replies(self) -> None:
        """Reader thread: route replies to waiting callers and tool calls to their session."""
        try:
            for line in iter(self._proc.stdout.readline, b""):
                item = proto.classify(line)
                if isinstance(item, proto.ToolCall):
                    self._dispatch_tool_call(item)
                elif isinstance(item, OutputEvent):
                    with self._lock:
                        sink = self._sinks.get(item.id)
                    if sink is not None:
                        sink.feed(item)  # here, on the reader: a slow callback holds the output
                elif isinstance(item, proto.Reply):
                    with self._lock:
                        future = self._pending.pop(item.id, None)
                    if future is not None:
                        future.set_result(item.message)
                elif item is not None:
                    self._note_stderr(item)
        finally:
            self._connection_lost()

    def _connection_lost(self) -> None:
        # Let the exit status and the last stderr lines arrive, for the error message.
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._stderr_thread.join(timeout=2)
        with self._lock:
            error = proto.connection_lost_error(self._closed, bool(self.version),
                                                self._proc.returncode, self._stderr_text())
            self._lost = error
            pending = list(self._pending.values())
            self._pending.clear()
        for future in pending:
            future.set_exception(proto.copy_error(error))

    def _dispatch_tool_call(self, call: proto.ToolCall) -> None:
        with self._lock:
            session = self._sessions.get(call.session)  # type: ignore[arg-type]
        if session is None:
            self._send_quietly(proto.tool_result_message(
                call.session, call.call_id, error=LookupError("no such session")))
            return
        try:
            # Never run user code on the reader thread: a tool may itself call the sandbox.
            self._tool_pool.submit(session._answer_tool_call, call)
        except RuntimeError:  # pool shut down: we are closing
            pass

    def _send_quietly(self, line: bytes) -> None:
        try:
            self._send(line)
        except SqboxError:
            pass

    def _drain_stderr(self) -> None:
        for chunk in iter(lambda: self._proc.stderr.read1(65536), b""):
            self._note_stderr(chunk)

    def _note_stderr(self, chunk: bytes) -> None:
        self._stderr.note(chunk)

    def _stderr_text(self) -> str:
        return self._stderr.text()


class Session:
    """A persistent Python interpreter in its own sandbox; made by `Sandbox.session()`.

    Safe to use from several threads, but the server runs one `execute` at a time per session.
    Use as a context manager, or call `close()`.
    """

    def __init__(self, sandbox: Sandbox, session_id: str,
                 tools: Dict[str, Callable[..., Any]], timeout: Optional[float]) -> None:
        self._sandbox = sandbox
        self._id = session_id
        self._tools = dict(tools)
        self._tools_lock = threading.Lock()
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

    def execute(self, code: str, *, timeout: Optional[float] = None,
                on_stdout: Optional[OutputCallback] = None,
                on_stderr: Optional[OutputCallback] = None) -> ExecResult:
        """Run `code` in the session's persistent namespace and return its `ExecResult`.

        An exception in the code is reported in `.error` (see `raise_for_error()`); on timeout
        the code is interrupted and `.timed_out` is set. Raises `SessionDead` if the
        interpreter died (then `reset()` it). `on_stdout`/`on_stderr` get the output while the
        code runs, as for `Sandbox.run`.
        """
        sink = OutputSink.wanted(on_stdout, on_stderr)
        reply = self._call(proto.exec_request(self._id, code, proto.pick(timeout, self._timeout),
                                              stream=sink is not None), sink=sink)
        return proto.exec_result_from_reply(reply)

    def spawn(self, cmd: Command, *, env: Optional[Mapping[str, Any]] = None,
              cwd: Optional[str] = None) -> BackgroundProcess:
        """Start `cmd` (argv, or a string for `sh -c`) in the background in this session's
        sandbox; read its output, wait for it or kill it through the returned
        `BackgroundProcess`. It ends with the session at the latest."""
        reply = self._call(processes.start_request(self._id, cmd, env, cwd))
        process_id, pid = processes.started(reply)
        return BackgroundProcess(self, process_id, pid)

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to the file `path` inside the session's sandbox (at most 64 MiB)."""
        proto.raise_for_reply(self._call(proto.put_request(self._id, path, data)), "put")

    def get(self, path: str) -> bytes:
        """Read the file `path` from inside the session's sandbox (at most 64 MiB)."""
        reply = self._call({"op": "get", "session": self._id, "path": path})
        return proto.data_from_get_reply(reply)

    def reset(self) -> None:
        """Replace the interpreter by a fresh one in a fresh sandbox (same id and tools)."""
        proto.raise_for_reply(self._call({"op": "reset", "session": self._id}), "reset")

    def upload(self, local: PathLike, remote: str) -> Transfer:
        """Copy the local file or directory `local` into the sandbox's directory `remote`
        (made if missing): a directory's contents go beneath it, a file by its name. Symlinks
        are copied as symlinks; one pointing outside `remote` is refused. At most the sandbox's
        writable budget (`--tmpfs-size`)."""
        with _transfer.pack(local) as archive_file:
            return self.upload_tar(archive_file, remote)

    def upload_tar(self, archive: Any, remote: str) -> Transfer:
        """Unpack a tar stream (bytes or a binary file object; gzip too) beneath the sandbox's
        directory `remote`. Entries with absolute names or `..`, links pointing outside
        `remote`, and paths through a symlink already in the sandbox are refused
        (`SqboxError`); devices and FIFOs are left out."""
        reply: Dict[str, Any] = {}
        for request in _transfer.upload_requests(self._id, remote,
                                                  _transfer.archive_source(archive)):
            reply = self._call(request)
            proto.raise_for_reply(reply, "upload")
        return _transfer.upload_result(reply)

    def download(self, remote: str, local: PathLike) -> Transfer:
        """Copy the sandbox's file or directory `remote` into the local directory `local`
        (made if missing). Nothing in the sandbox is followed out of it, and nothing of it
        is written outside `local`: links pointing outside it are left out (`.skipped`).
        Stops with `SqboxError` past the sandbox's writable budget."""
        def chunk(offset: int) -> Any:
            reply = self._call(_transfer.download_request(self._id, remote, offset))
            proto.raise_for_reply(reply, "download")
            return _transfer.download_chunk(reply)

        stream, skipped = _transfer.receive(chunk)
        with stream:
            return _transfer.unpack(stream, local, skipped)

    def shell(self, name: str = "main", *, timeout: Optional[float] = None,
              program: Optional[Sequence[str]] = None) -> ShellSession:
        """A shell beside the interpreter, in the same sandbox: `bash`, or `sh` where the
        image has none, or `program`. Shells are kept by `name`; each keeps its working
        directory and variables until it is closed or the session is reset. `timeout` (default:
        the session's) is the default of each `run()`."""
        return ShellSession(self, name, timeout=proto.pick(timeout, self._timeout),
                            program=list(program) if program is not None else None)

    def register_tool(self, fn: Callable[..., Any], name: Optional[str] = None,
                      ) -> Callable[..., Any]:
        """Make `fn` callable inside the session as `tools.NAME(...)`; returns `fn`.

        `name` defaults to `fn.__name__`. Calls run in a worker thread of the host; the return
        value must be JSON-serialisable, an exception is raised inside as `ToolError`.
        """
        tool = proto.tool_name(fn, name)
        # Held across the round trip so concurrent registrations reach the server in order.
        with self._tools_lock:
            names = dict(self._tools, **{tool: fn})
            # Known locally first: a call may arrive as soon as the server has the name.
            self._tools = names
            reply = self._call({"op": "tools", "session": self._id, "names": list(names)})
            proto.raise_for_reply(reply, "tools")
        return fn

    def close(self) -> None:
        """Destroy the session's sandbox. Closing twice, or after the Sandbox closed, is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            # The reply is not checked: a dead or unknown session is as closed as can be.
            self._sandbox._request({"op": "close", "session": self._id})
        except SqboxError:
            if not (self._sandbox.closed or self._sandbox._lost):
                raise
        finally:
            with self._sandbox._lock:
                self._sandbox._sessions.pop(self._id, None)

    @property
    def closed(self) -> bool:
        """True once the session (or its Sandbox) was closed."""
        return self._closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _call(self, message: Dict[str, Any], sink: Optional[OutputSink] = None,
              ) -> Dict[str, Any]:
        if self._closed:
            raise SqboxError(f"session {self._id} is closed")
        return self._sandbox._request(message, sink=sink)

    def _answer_tool_call(self, call: proto.ToolCall) -> None:
        """Runs in a tool worker thread: call the function, send back result or error."""
        fn = self._tools.get(call.name)  # type: ignore[arg-type]
        if fn is None:
            line = proto.tool_result_message(self._id, call.call_id,
                                             error=NameError(f"no tool named {call.name!r}"))
        else:
            try:
                line = proto.tool_result_message(self._id, call.call_id,
                                                 result=fn(*call.args, **call.kwargs))
            except Exception as exc:  # the tool's failure is the sandboxed caller's to handle
                line = proto.tool_result_message(self._id, call.call_id, error=exc)
        self._sandbox._send_quietly(line)

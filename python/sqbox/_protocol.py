"""The `sqbox serve` wire protocol (src/session/PROTOCOL.md): building requests, reading replies.

Shared by the threaded client (_sync) and the asyncio client (_aio), and by the one-shot
`run`, which uses the same argument normalisation to build a `sqbox run` command line.
"""
from __future__ import annotations

import base64
import binascii
import collections
import json
import os
import threading
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from ._display import display_from_reply
from ._errors import ProtocolError, SessionDead, SqboxError
from ._results import ExecError, ExecResult, Result
from ._streaming import OutputEvent, is_output_event

# Public argument types.
Command = Union[str, Sequence[str]]
MountSpec = Union[Tuple[str, str], Tuple[str, str, str], Mapping[str, Any]]
Size = Union[int, str]
Stdin = Union[str, bytes, None]
ToolsArg = Union[Mapping[str, Callable[..., Any]], Iterable[Callable[..., Any]], None]

# A reply line can carry a 64 MiB file, base64-encoded, plus JSON framing.
MAX_LINE = 256 * 1024 * 1024
# How long close() lets the server wind down (kill every sandbox) before killing it.
CLOSE_TIMEOUT = 10.0
# How long a request whose send found the server gone waits for the reader's account of why
# (exit status and last stderr lines; the reader itself waits at most 5 s + 2 s for them).
LOST_REPORT_WAIT = 10.0
# How much of the server's stderr is kept for error messages.
STDERR_TAIL = 64 * 1024


# ---------------------------------------------------------------------------------------------
# Argument normalisation


def normalize_command(cmd: Command) -> List[str]:
    """A string runs through `sh -c`; a sequence is the argv itself."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    if isinstance(cmd, bytes):
        raise TypeError("cmd must be a str or a sequence of str, not bytes")
    argv = [os.fspath(part) for part in cmd]
    if not argv:
        raise ValueError("cmd is empty")
    for part in argv:
        if not isinstance(part, str):
            raise TypeError(f"cmd elements must be str, got {type(part).__name__}")
    return argv


def normalize_mounts(mounts: Optional[Iterable[MountSpec]]) -> List[Dict[str, Any]]:
    """Mounts as the protocol's {source, target, read_only} objects, sources made absolute."""
    result = []
    for mount in mounts or ():
        if isinstance(mount, Mapping):
            unknown = set(mount) - {"source", "target", "read_only"}
            if unknown:
                raise ValueError(f"unknown mount keys: {sorted(unknown)}")
            source, target = mount["source"], mount["target"]
            read_only = bool(mount.get("read_only", False))
        else:
            parts = tuple(mount)
            if len(parts) == 2:
                (source, target), mode = parts, "rw"
            elif len(parts) == 3:
                source, target, mode = parts
            else:
                raise ValueError(f"a mount is (source, target) or (source, target, mode): "
                                 f"{mount!r}")
            if mode not in ("ro", "rw"):
                raise ValueError(f"mount mode must be 'ro' or 'rw', got {mode!r}")
            read_only = mode == "ro"
        result.append({"source": os.path.abspath(os.fspath(source)),
                       "target": os.fspath(target), "read_only": read_only})
    return result


def normalize_env(env: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """Environment variables as str → str; a key may not contain '='."""
    result = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ValueError(f"invalid environment variable name: {key!r}")
        result[key] = str(value)
    return result


def size_text(size: Size) -> str:
    """A size as sqbox spells it: a byte count or a string such as '512M'."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"a size is an int (bytes) or a str such as '1G', got {size!r}")
    return str(size)


def check_network(network: bool) -> None:
    if network:
        raise ValueError("sqbox sandboxes have no network (loopback only); network=True "
                         "cannot be honoured")


def merge_env(default: Optional[Mapping[str, Any]],
              override: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    merged = normalize_env(default)
    merged.update(normalize_env(override))
    return merged


# ---------------------------------------------------------------------------------------------
# Requests


def _common_options(*, timeout: Optional[float] = None, memory: Optional[Size] = None,
                    mounts: Optional[Iterable[MountSpec]] = None,
                    env: Optional[Mapping[str, Any]] = None,
                    output_limit: Optional[int] = None) -> Dict[str, Any]:
    request: Dict[str, Any] = {}
    if timeout is not None:
        request["timeout"] = float(timeout)
    if memory is not None:
        request["memory"] = size_text(memory)
    mount_list = normalize_mounts(mounts)
    if mount_list:
        request["mounts"] = mount_list
    env_map = normalize_env(env)
    if env_map:
        request["env"] = env_map
    if output_limit is not None:
        request["output_limit"] = int(output_limit)
    return request


def run_request(cmd: Command, *, timeout: Optional[float], memory: Optional[Size],
                mounts: Optional[Iterable[MountSpec]], env: Optional[Mapping[str, Any]],
                stdin: Stdin, output_limit: Optional[int], stream: bool = False,
                ) -> Dict[str, Any]:
    """The `run` op. Output is asked for in base64 so that `*_bytes` are exact."""
    request: Dict[str, Any] = {"op": "run", "command": normalize_command(cmd), "binary": True}
    if stream:
        request["stream"] = True
    request.update(_common_options(timeout=timeout, memory=memory, mounts=mounts, env=env,
                                   output_limit=output_limit))
    if isinstance(stdin, str):
        request["stdin"] = stdin
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        request["stdin_b64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    elif stdin is not None:
        raise TypeError("stdin must be str, bytes or None")
    return request


def session_open_request(*, env: Optional[Mapping[str, Any]],
                         mounts: Optional[Iterable[MountSpec]], memory: Optional[Size],
                         output_limit: Optional[int], tools: Sequence[str]) -> Dict[str, Any]:
    request = {"op": "session_open", "tools": list(tools)}
    request.update(_common_options(memory=memory, mounts=mounts, env=env,
                                   output_limit=output_limit))
    return request


def pick(value: Any, default: Any) -> Any:
    """A call's argument, or the sandbox's default when the call left it out (None)."""
    return default if value is None else value


class Defaults:
    """A sandbox's defaults for every call, and the requests they make with a call's overrides:
    scalars replace the default, mounts add to it, env merges into it."""

    def __init__(self, *, timeout: Optional[float], memory: Optional[Size],
                 mounts: Optional[Iterable[MountSpec]], env: Optional[Mapping[str, Any]],
                 output_limit: Optional[int]) -> None:
        self.timeout = timeout
        self.memory = memory
        self.mounts: List[MountSpec] = list(mounts or ())
        self.env = normalize_env(env)
        self.output_limit = output_limit

    def run_request(self, cmd: Command, *, timeout: Optional[float], memory: Optional[Size],
                    mounts: Optional[Iterable[MountSpec]], env: Optional[Mapping[str, Any]],
                    stdin: Stdin, output_limit: Optional[int], stream: bool = False,
                    ) -> Dict[str, Any]:
        return run_request(
            cmd, timeout=pick(timeout, self.timeout), memory=pick(memory, self.memory),
            mounts=self.mounts + list(mounts or ()), env=merge_env(self.env, env), stdin=stdin,
            output_limit=pick(output_limit, self.output_limit), stream=stream)

    def session_open_request(self, *, env: Optional[Mapping[str, Any]],
                             mounts: Optional[Iterable[MountSpec]], memory: Optional[Size],
                             output_limit: Optional[int], tools: Sequence[str]) -> Dict[str, Any]:
        return session_open_request(
            env=merge_env(self.env, env), mounts=self.mounts + list(mounts or ()),
            memory=pick(memory, self.memory),
            output_limit=pick(output_limit, self.output_limit), tools=tools)


class StderrTail:
    """The last STDERR_TAIL bytes or so of the server's stderr, for error messages. Thread-safe
    (nothing awaits inside it, so the asyncio client may use it as well)."""

    def __init__(self) -> None:
        self._chunks: "collections.deque[bytes]" = collections.deque()
        self._size = 0
        self._lock = threading.Lock()

    def note(self, chunk: bytes) -> None:
        with self._lock:
            self._chunks.append(chunk)
            self._size += len(chunk)
            while self._size > STDERR_TAIL and len(self._chunks) > 1:
                self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", "replace")


def connection_lost_error(closed: bool, started: bool, returncode: Optional[int],
                          stderr: str) -> SqboxError:
    """Why a sandbox's requests can no longer be answered once its server is gone."""
    if closed:
        return SqboxError("the sandbox was closed")
    what = "exited unexpectedly" if started else "failed to start"
    return SqboxError(f"sqbox serve {what} (exit status {returncode})", stderr=stderr)


def copy_error(error: SqboxError) -> SqboxError:
    """A fresh copy of `error` for another waiter (an exception carries its own traceback)."""
    return SqboxError(str(error.args[0]), stderr=error.stderr)


def exec_request(session: str, code: str, timeout: Optional[float],
                 stream: bool = False) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    request: Dict[str, Any] = {"op": "exec", "session": session, "code": code}
    if stream:
        request["stream"] = True
    if timeout is not None:
        request["timeout"] = float(timeout)
    return request


def put_request(session: str, path: str, data: bytes) -> Dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("data must be bytes")
    return {"op": "put", "session": session, "path": path,
            "data_b64": base64.b64encode(bytes(data)).decode("ascii")}


def encode(message: Mapping[str, Any]) -> bytes:
    """One protocol line. ASCII-only JSON, so no newline can appear inside it; NaN and
    infinities are refused (ValueError) because they are not JSON."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def decode(line: bytes) -> Dict[str, Any]:
    """One line from the server; ValueError for anything that is not a well-formed JSON object
    (a session's code can forge lines the server passes on, so nothing here may be trusted
    further, nor raise anything else)."""
    try:
        message = json.loads(line)
    except RecursionError:
        raise ValueError(f"nested too deeply: {line[:200]!r}") from None
    if not isinstance(message, dict):
        raise ValueError(f"not a JSON object: {line[:200]!r}")
    return message


# ---------------------------------------------------------------------------------------------
# Tools


def collect_tools(tools: ToolsArg) -> Dict[str, Callable[..., Any]]:
    """Tools given as a {name: callable} mapping or as callables named by their __name__."""
    if tools is None:
        return {}
    if isinstance(tools, Mapping):
        items = dict(tools)
    else:
        items = {tool_name(fn): fn for fn in tools}
    for name, fn in items.items():
        if not callable(fn):
            raise TypeError(f"tool {name!r} is not callable")
        check_tool_name(name)
    return items


def tool_name(fn: Callable[..., Any], name: Optional[str] = None) -> str:
    name = name if name is not None else getattr(fn, "__name__", None)
    if not name:
        raise ValueError(f"cannot tell the name of tool {fn!r}; pass name=")
    check_tool_name(name)
    return name


def check_tool_name(name: str) -> None:
    # Tools are called as attributes of `tools` inside the sandbox.
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a tool name must be a Python identifier, got {name!r}")


def tool_result_message(session: str, call_id: Any, *, result: Any = None,
                        error: Optional[BaseException] = None) -> bytes:
    """The encoded `tool_result` line; a result that is not JSON-serialisable becomes an error."""
    message: Dict[str, Any] = {"op": "tool_result", "session": session, "call_id": call_id}
    if error is None:
        message["result"] = result
        try:
            return encode(message)
        except (TypeError, ValueError) as exc:
            error = TypeError(f"tool result is not JSON-serialisable: {exc}")
            del message["result"]
    message["error"] = {"type": type(error).__name__, "message": str(error)}
    return encode(message)


class ToolCall:
    """A `tool_call` event from the server."""

    __slots__ = ("session", "call_id", "name", "args", "kwargs")

    def __init__(self, message: Mapping[str, Any]) -> None:
        """Raises ValueError for a malformed call (it comes from sandboxed code)."""
        self.session = message.get("session")
        self.call_id = message.get("call_id")
        self.name = message.get("name")
        args = message.get("args", [])
        kwargs = message.get("kwargs", {})
        if not isinstance(self.session, str) or not _is_id(self.call_id) \
                or not isinstance(self.name, str) or not isinstance(args, list) \
                or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError("malformed tool call")
        self.args = list(args)
        self.kwargs = dict(kwargs)


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def is_tool_call(message: Mapping[str, Any]) -> bool:
    return message.get("event") == "tool_call"


class Reply:
    """The answer to the request with `id`."""

    __slots__ = ("id", "message")

    def __init__(self, request_id: Union[str, int], message: Dict[str, Any]) -> None:
        self.id = request_id
        self.message = message


def classify(line: bytes) -> Union[ToolCall, OutputEvent, Reply, bytes, None]:
    """What a line from the server is: a ToolCall, an OutputEvent, a Reply, a note for the log
    (bytes) about a line that was dropped, or None for an event nobody waits for. Sessions can
    forge lines the server passes on, so nothing here raises on bad input."""
    try:
        message = decode(line)
    except ValueError:
        return b"sqbox client: unreadable line from server: " + line[:200] + b"\n"
    if is_output_event(message):
        try:
            return OutputEvent(message)
        except ValueError:
            return b"sqbox client: malformed output event\n"
    if is_tool_call(message):
        try:
            return ToolCall(message)
        except ValueError:
            return b"sqbox client: malformed tool call from a session\n"
    request_id = message.get("id")
    if "event" not in message and _is_id(request_id):
        return Reply(request_id, message)
    return None


# ---------------------------------------------------------------------------------------------
# Replies
#
# Each field a reply should have is checked for its type before use: a session's code can forge
# the reply to its own request (SECURITY.md), and nothing in it may end in an AttributeError, a
# TypeError or a hang. A malformed reply raises ProtocolError (an exec's becomes an error result).

_MISSING = object()


def _field(reply: Mapping[str, Any], name: str, kinds: Any, default: Any = _MISSING) -> Any:
    """reply[name] if it is of `kinds` (bool is not an int here), else ProtocolError; a missing
    field gives `default` when there is one."""
    value = reply.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ProtocolError(f"malformed reply: no {name!r}")
        return default
    wanted = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in wanted:
        wanted = ()
    if not isinstance(value, wanted):
        names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in
                            (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise ProtocolError(f"malformed reply: {name!r} must be {names}, "
                            f"not {type(value).__name__}")
    return value


def _error_text(error: Any) -> str:
    if isinstance(error, Mapping):
        return f"{error.get('type', 'Error')}: {error.get('message', '')}".rstrip(": ")
    return str(error) if error is not None else ""


def raise_for_reply(reply: Mapping[str, Any], what: str) -> None:
    """Raise `SessionDead` or `SqboxError` for a failed reply (`ok` anything but true)."""
    if reply.get("ok") is True:
        return
    error = reply.get("error")
    stderr = reply.get("stderr")
    stderr = stderr if isinstance(stderr, str) else ""
    if not isinstance(reply.get("ok"), bool):
        raise ProtocolError(f"{what}: malformed reply: 'ok' must be a bool", stderr=stderr)
    if reply.get("session_dead") is True:
        message = error.get("message") if isinstance(error, Mapping) else None
        if not isinstance(message, str) or not message:
            message = "the session is dead"
        raise SessionDead(f"{what}: {message}", stderr=stderr)
    raise SqboxError(f"{what} failed: {_error_text(error) or 'no reason given'}", stderr=stderr)


def _b64(reply: Mapping[str, Any], name: str, required: bool = False) -> bytes:
    text = _field(reply, name, str) if required else \
        _field(reply, name, (str, type(None)), None) or ""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"malformed reply: {name!r} is not base64: {exc}") from None


def _output(reply: Mapping[str, Any], name: str) -> bytes:
    if f"{name}_b64" in reply:
        return _b64(reply, f"{name}_b64")
    return (_field(reply, name, (str, type(None)), None) or "").encode("utf-8")


def result_from_reply(reply: Mapping[str, Any]) -> Result:
    """The `Result` of a `run` reply; raises `SqboxError` when sqbox failed to run the command
    (`ProtocolError` for a malformed reply)."""
    raise_for_reply(reply, "run")
    stdout, stderr = _output(reply, "stdout"), _output(reply, "stderr")
    exit_code = _field(reply, "exit_code", int)
    error = reply.get("error")
    if exit_code == 125 and error:
        # sqbox could not set the sandbox up (the server says so with ok true, status 125).
        if isinstance(error, Mapping):
            error = error.get("message") or error.get("type")
        raise SqboxError(f"sqbox failed: {error}", stderr=stderr.decode("utf-8", "replace"))
    _field(reply, "signal", (int, type(None)), None)
    for name in ("timed_out", "oom_killed", "stdout_truncated", "stderr_truncated"):
        _field(reply, name, bool, False)
    for name in ("wall_ms", "cpu_ms"):
        _field(reply, name, (int, float, type(None)), None)
    return make_result(reply, exit_code, stdout, stderr)


def make_result(record: Mapping[str, Any], exit_code: int, stdout: bytes,
                stderr: bytes) -> Result:
    return Result(
        exit_code=exit_code,
        signal=record.get("signal"),
        timed_out=bool(record.get("timed_out", False)),
        oom_killed=bool(record.get("oom_killed", False)),
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        stdout_bytes=stdout,
        stderr_bytes=stderr,
        stdout_truncated=bool(record.get("stdout_truncated", False)),
        stderr_truncated=bool(record.get("stderr_truncated", False)),
        wall_ms=float(record.get("wall_ms") or 0.0),
        cpu_ms=float(record.get("cpu_ms") or 0.0),
    )


def _exec_error(error: Any) -> Optional[ExecError]:
    if error is None:
        return None
    if not isinstance(error, Mapping):
        raise ProtocolError(f"malformed reply: 'error' must be an object or null, "
                            f"not {type(error).__name__}")
    return ExecError(type=_field(error, "type", str),
                     message=_field(error, "message", str, ""),
                     traceback=_field(error, "traceback", (str, type(None)), None) or "")


def exec_result_from_reply(reply: Mapping[str, Any]) -> ExecResult:
    """The `ExecResult` of an exec reply. A failed request raises (`SessionDead`, `SqboxError`);
    a malformed reply (the session's code can forge it) is a result whose error is of type
    "ProtocolError", so that it is never taken for a success."""
    try:
        raise_for_reply(reply, "exec")
        return ExecResult(
            stdout=_field(reply, "stdout", (str, type(None)), None) or "",
            stderr=_field(reply, "stderr", (str, type(None)), None) or "",
            value=_field(reply, "value", (str, type(None)), None),
            error=_exec_error(reply.get("error")),
            timed_out=_field(reply, "timed_out", bool, False),
            stdout_truncated=_field(reply, "stdout_truncated", bool, False),
            stderr_truncated=_field(reply, "stderr_truncated", bool, False),
            display=display_from_reply(reply),
        )
    except ProtocolError as exc:
        timed_out = reply.get("timed_out")
        return ExecResult(stdout="", stderr="", value=None,
                          error=ExecError(type="ProtocolError", message=str(exc), traceback=""),
                          timed_out=timed_out if isinstance(timed_out, bool) else False,
                          stdout_truncated=False, stderr_truncated=False)


def data_from_get_reply(reply: Mapping[str, Any]) -> bytes:
    raise_for_reply(reply, "get")
    return _b64(reply, "data_b64", required=True)


def session_from_open_reply(reply: Mapping[str, Any]) -> str:
    raise_for_reply(reply, "session_open")
    return _field(reply, "session", str)


def version_from_ping_reply(reply: Mapping[str, Any]) -> str:
    raise_for_reply(reply, "ping")
    return _field(reply, "version", str, "")


# ---------------------------------------------------------------------------------------------
# Command lines


def serve_argv(binary: str, image: str, *, max_parallel: Optional[int], pool: Optional[int],
               extra_args: Sequence[str]) -> List[str]:
    argv = [binary, "serve"]
    if max_parallel is not None:
        argv += ["--max-parallel", str(int(max_parallel))]
    if pool is not None:
        argv += ["--pool", str(int(pool))]
    argv += [os.fspath(arg) for arg in extra_args]
    argv.append(image)
    return argv


def run_argv(binary: str, image: str, cmd: Command, *, json_path: str,
             timeout: Optional[float], memory: Optional[Size],
             mounts: Optional[Iterable[MountSpec]], env: Optional[Mapping[str, Any]],
             output_limit: Optional[int]) -> List[str]:
    """`sqbox run ... --json FILE IMAGE -- CMD...`."""
    argv = [binary, "run", "--json", json_path]
    if timeout is not None:
        argv += ["--timeout", repr(float(timeout))]
    if memory is not None:
        argv += ["--memory", size_text(memory)]
    for mount in normalize_mounts(mounts):
        if ":" in mount["source"] or ":" in mount["target"]:
            raise ValueError(f"sqbox run cannot mount paths containing ':': {mount}")
        mode = "ro" if mount["read_only"] else "rw"
        argv += ["--mount", f"{mount['source']}:{mount['target']}:{mode}"]
    for key, value in normalize_env(env).items():
        argv += ["--env", f"{key}={value}"]
    if output_limit is not None:
        argv += ["--output-limit", str(int(output_limit))]
    argv += [image, "--", *normalize_command(cmd)]
    return argv

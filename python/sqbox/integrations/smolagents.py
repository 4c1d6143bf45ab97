"""A smolagents Python executor that runs the agent's code in sqbox.

`SqboxExecutor` has the interface of smolagents' remote executors (`RemotePythonExecutor` in
`src/smolagents/remote_executors.py`): `send_tools(tools)`, `send_variables(variables)`,
`__call__(code_action) -> CodeOutput(output, logs, is_final_answer)`, `run_code_raise_errors`,
`install_packages` and `cleanup()`. Hand one to an agent with `CodeAgent(..., executor=...)`.

- The code runs in a real Python interpreter in a sqbox sandbox. By default one session keeps
  the state across steps; with `ephemeral=True` every step gets a fresh sandbox, and the step's
  variables travel to the next one through the host as pickles (nothing else survives a step:
  no files, no processes, no unpicklable globals).
- Tools are called on the host (they keep their credentials and network there): inside the
  sandbox `search(q)` is a call back to the host's `search`. Their arguments and results cross
  as JSON.
- `final_answer(x)` ends the step (smolagents' `FinalAnswerException`, a `BaseException`).

Values the sandbox hands back (the final answer, the state of an ephemeral step) cross as JSON
when they are plain JSON (str, int, float, bool, None, lists and str-keyed dicts of those).
Anything else (an image, a DataFrame, a tuple) is pickled INSIDE the sandbox and reaches the
host as a `SandboxValue`: its type name, its repr and the pickle's bytes, which the host never
unpickles (a pickle made by the sandbox is code the sandbox chose; unpickling it on the host
would run that code there). A `SandboxValue` handed back in (`send_variables`, or an ephemeral
step's state) is unpickled inside the next sandbox, where it can do no harm. Values the host
hands in are pickled on the host and unpickled inside the sandbox, so the image needs the
modules their classes come from. The trailing expression's value comes back as a Python literal
(`ast.literal_eval` of its repr) when it is one, else as the repr string.
"""
from __future__ import annotations

import ast
import base64
import binascii
import json
import keyword
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import sqbox

try:  # With smolagents installed, the executor is one of its PythonExecutors.
    from smolagents.local_python_executor import CodeOutput, PythonExecutor
except ImportError:
    @dataclass
    class CodeOutput:  # type: ignore[no-redef]
        """What one step produced (smolagents' `CodeOutput`, a dataclass of these fields)."""

        output: Any
        logs: str
        is_final_answer: bool

    class PythonExecutor:  # type: ignore[no-redef]
        """Stand-in base class when smolagents is not installed."""

__all__ = ["CodeOutput", "ExecutionError", "SandboxValue", "SqboxExecutor"]

FINAL_ANSWER_EXCEPTION = "FinalAnswerException"
_VARIABLES_PATH = "/tmp/.sqbox-variables.json"
_STATE_PATH = "/tmp/.sqbox-state.json"
_REPR_CAP = 2000

# Defined in every session once, before any agent code. Names start with `_sqbox_` (skipped
# when an ephemeral step's state is collected) except the two the agent's code uses.
_PRELUDE = f'''
import base64 as _sqbox_base64, json as _sqbox_json, pickle as _sqbox_pickle, types as _sqbox_types

class FinalAnswerException(BaseException):
    """Ends the step; a BaseException, so that `except Exception` in agent code lets it by."""

def _sqbox_plain(value):
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) is list:
        return all(_sqbox_plain(item) for item in value)
    if type(value) is dict:
        return all(type(k) is str and _sqbox_plain(v) for k, v in value.items())
    return False

def _sqbox_encode(value):
    try:
        if _sqbox_plain(value):
            _sqbox_json.dumps(value, allow_nan=False)
            return {{"json": value}}
    except (ValueError, RecursionError):
        pass
    kind = type(value)
    try:
        text = repr(value)[:{_REPR_CAP}]
    except Exception:
        text = "<unrepresentable>"
    encoded = {{"type": kind.__module__ + "." + kind.__qualname__, "repr": text}}
    try:
        encoded["pickle"] = _sqbox_base64.b64encode(_sqbox_pickle.dumps(value, protocol=4)).decode()
    except Exception:
        pass
    return encoded

def final_answer(answer):
    tools.final_answer(_sqbox_encode(answer))
    raise FinalAnswerException()

def _sqbox_define_tool(name):
    def tool(*args, **kwargs):
        return getattr(tools, name)(*args, **kwargs)
    tool.__name__ = tool.__qualname__ = name
    globals()[name] = tool

def _sqbox_load(path):
    import os, sys
    with open(path) as source:
        payload = _sqbox_json.load(source)
    os.unlink(path)
    for name, data in payload.items():
        try:
            globals()[name] = _sqbox_pickle.loads(_sqbox_base64.b64decode(data))
        except Exception as exc:
            print("variable %r could not be restored: %s: %s" % (name, type(exc).__name__, exc),
                  file=sys.stderr)

def _sqbox_collect(path):
    state = {{}}
    for name, value in list(globals().items()):
        if name.startswith("_") or name == "tools" or isinstance(
                value, (_sqbox_types.ModuleType, _sqbox_types.FunctionType, type)):
            continue
        encoded = _sqbox_encode(value)
        if "json" in encoded or "pickle" in encoded:
            state[name] = encoded
    with open(path, "w") as sink:
        _sqbox_json.dump(state, sink)

def _sqbox_missing(names):
    import importlib.metadata, importlib.util
    missing = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                continue
        except (ImportError, ValueError):
            pass
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing
'''


class ExecutionError(RuntimeError):
    """The agent's code raised or timed out; the message carries the logs and the traceback.

    smolagents' agents turn any exception of the executor into an observation for the model.
    """


@dataclass(frozen=True)
class SandboxValue:
    """A value made in the sandbox that is not plain JSON, as the host receives it.

    `type` is its class (module.qualname), `repr` its repr (cut at 2000 characters), `pickle`
    the bytes of its pickle made inside the sandbox, or None if it could not be pickled. The
    host never unpickles them: hand the value back in (`send_variables`) to use it in a sandbox.
    """

    type: str
    repr: str
    pickle: Optional[bytes] = field(default=None, repr=False)


def decode_value(encoded: Any) -> Any:
    """A value as the sandbox encoded it (`{"json": v}` or type/repr/pickle), never unpickled."""
    if isinstance(encoded, dict) and set(encoded) == {"json"}:
        return encoded["json"]
    if not isinstance(encoded, dict):
        return SandboxValue("<malformed>", repr(encoded)[:_REPR_CAP])
    type_name, text, data = encoded.get("type"), encoded.get("repr"), encoded.get("pickle")
    if not isinstance(type_name, str) or not isinstance(text, str):
        return SandboxValue("<malformed>", repr(encoded)[:_REPR_CAP])
    raw = None
    if isinstance(data, str):
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raw = None
    return SandboxValue(type_name, text[:_REPR_CAP], raw)


def _pickled(name: str, value: Any) -> str:
    """A value to hand in, as base64 of a pickle: the host's own values are pickled here, a
    SandboxValue's pickle (made by an earlier sandbox) is passed on without being opened."""
    if isinstance(value, SandboxValue):
        if value.pickle is None:
            raise ValueError(f"variable {name!r} ({value.type}) could not be pickled in the "
                             f"sandbox and cannot be handed in")
        data = value.pickle
    else:
        data = pickle.dumps(value, protocol=4)
    return base64.b64encode(data).decode("ascii")


def _literal(value: Optional[str]) -> Any:
    if value is None:
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _check_tool_name(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"a tool name must be a Python identifier: {name!r}")


class SqboxExecutor(PythonExecutor):
    """Runs a code agent's steps in sqbox.

    `image` is a squashfs image with python3 (and whatever the agent imports: sandboxes have no
    network). `additional_imports` are checked to be importable in the image, as smolagents'
    remote executors install them; `logger` is accepted for smolagents' signature and unused.
    `ephemeral=True` gives every step a fresh sandbox (see the module's documentation).
    `timeout` bounds each step (seconds); `memory` caps each sandbox (e.g. "1G"). `sandbox` is
    an existing `sqbox.Sandbox` to use instead of starting a server (then it is not closed by
    `cleanup()`). Use as a context manager, or call `cleanup()`.
    """

    def __init__(self, image: Optional[str] = None, additional_imports: Iterable[str] = (),
                 logger: Any = None, *, ephemeral: bool = False, timeout: float = 30.0,
                 memory: Optional[str] = None, binary: Optional[str] = None,
                 sandbox: Optional[sqbox.Sandbox] = None) -> None:
        if sandbox is None and image is None:
            raise ValueError("SqboxExecutor needs an image or a sandbox")
        self.logger = logger
        self.ephemeral = ephemeral
        self.timeout = timeout
        self.memory = memory
        self._own_sandbox = sandbox is None
        self._sandbox = sandbox if sandbox is not None else sqbox.Sandbox(image, binary=binary)
        self._tools: Dict[str, Callable[..., Any]] = {}
        # What the host hands in: send_variables' values and, when ephemeral, the last step's.
        self._variables: Dict[str, Any] = {}
        self._state: Dict[str, Any] = {}
        # Steps run one at a time; the final answer of the step in progress lands here.
        self._step_lock = threading.Lock()
        self._final_answer: List[Any] = []
        self._session: Optional[sqbox.Session] = None
        try:
            if not ephemeral:
                self._session = self._open_session()
            self.installed_packages = self.install_packages(list(additional_imports))
        except BaseException:
            self.cleanup()
            raise

    # -- smolagents' interface ----------------------------------------------------------------

    def send_tools(self, tools: Mapping[str, Callable[..., Any]]) -> None:
        """Make these host callables (smolagents `Tool`s or functions) callable by name inside.

        `final_answer`, if given, is applied on the host to the answer the code passes to
        `final_answer(...)` (a `SandboxValue` if it is not plain JSON).
        """
        for name in tools:
            _check_tool_name(name)
        self._tools.update(tools)
        if self._session is not None:
            for name, fn in tools.items():
                if name != "final_answer":
                    self._session.register_tool(fn, name=name)
                    self._session.execute(f"_sqbox_define_tool({name!r})").raise_for_error()

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Make these values globals of the agent's code (pickled on the host, unpickled inside)."""
        if not variables:
            return
        for name in variables:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"a variable name must be a Python identifier: {name!r}")
        payload = {name: _pickled(name, value) for name, value in variables.items()}
        self._variables.update(variables)
        if self._session is not None:
            logs = self._hand_in(self._session, payload)
            if logs:
                raise ExecutionError(logs)

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one step; returns CodeOutput(output, logs, is_final_answer).

        `output` is the final answer if the code called `final_answer()`, else the value of the
        trailing expression. Raises `ExecutionError` if the code raised or timed out.
        """
        return self.run_code_raise_errors(code_action)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """As `__call__`: smolagents' remote executors implement their steps under this name."""
        with self._step_lock:
            if self.ephemeral:
                return self._ephemeral_step(code)
            assert self._session is not None
            return self._step(self._session, code, "")

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """Check that these modules or distributions are in the image; returns them.

        Sandboxes have no network, so nothing is downloaded: a missing one raises
        `ExecutionError` naming it (build it into the image instead).
        """
        names = [name for name in additional_imports if name != "*"]
        if not names:
            return list(additional_imports)
        if self._session is not None:
            missing = self._missing(self._session, names)
        else:
            with self._open_session() as session:
                missing = self._missing(session, names)
        if missing:
            raise ExecutionError(f"not in the image {self._sandbox.image}: {', '.join(missing)} "
                                 f"(sqbox sandboxes have no network to install them)")
        return list(additional_imports)

    def cleanup(self) -> None:
        """Close the session and the server (if this executor started it). Idempotent."""
        session, self._session = self._session, None
        try:
            if session is not None:
                session.close()
        finally:
            if self._own_sandbox:
                self._sandbox.close()

    # -- extras -------------------------------------------------------------------------------

    @property
    def state(self) -> Dict[str, Any]:
        """Ephemeral mode: the variables the last step left (JSON values, or SandboxValues)."""
        return dict(self._state)

    def __enter__(self) -> "SqboxExecutor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.cleanup()

    # -- plumbing -----------------------------------------------------------------------------

    def _open_session(self) -> sqbox.Session:
        session = self._sandbox.session(timeout=self.timeout, memory=self.memory,
                                        tools=self._session_tools())
        try:
            session.execute(_PRELUDE).raise_for_error()
            for name in self._tools:
                if name != "final_answer":
                    session.execute(f"_sqbox_define_tool({name!r})").raise_for_error()
        except BaseException:
            session.close()
            raise
        return session

    def _session_tools(self) -> Dict[str, Callable[..., Any]]:
        tools = {name: fn for name, fn in self._tools.items() if name != "final_answer"}
        tools["final_answer"] = self._record_final_answer
        return tools

    def _record_final_answer(self, encoded: Any) -> None:
        # Runs in a tool worker thread while the step waits for its execute() to finish.
        answer = decode_value(encoded)
        user_tool = self._tools.get("final_answer")
        if user_tool is not None:
            answer = user_tool(answer)
        self._final_answer.append(answer)

    def _hand_in(self, session: sqbox.Session, payload: Dict[str, str]) -> str:
        """Load base64 pickles as globals inside; returns what the loading wrote."""
        if not payload:
            return ""
        session.put(_VARIABLES_PATH, json.dumps(payload).encode("ascii"))
        result = session.execute(f"_sqbox_load({_VARIABLES_PATH!r})")
        if result.error is not None:
            raise ExecutionError(f"handing the variables in failed: {result.error.type}: "
                                 f"{result.error.message}")
        return result.stdout + result.stderr

    def _step(self, session: sqbox.Session, code: str, logs_before: str) -> CodeOutput:
        self._final_answer = []
        try:
            result = session.execute(code)
        except sqbox.SessionDead as exc:
            if not self.ephemeral:
                self._revive()
            raise ExecutionError(f"{logs_before}the interpreter died ({exc}); its state is "
                                 f"lost") from None
        answers = self._final_answer
        logs = logs_before + result.stdout + result.stderr
        if result.error is not None and result.error.type == FINAL_ANSWER_EXCEPTION:
            return CodeOutput(output=answers[0] if answers else None, logs=logs,
                              is_final_answer=True)
        if result.timed_out:
            raise ExecutionError(f"{logs}Code execution timed out after {self.timeout} s")
        if result.error is not None:
            detail = result.error.traceback or f"{result.error.type}: {result.error.message}\n"
            raise ExecutionError(f"{logs}Executing code yielded an error:\n{detail}")
        return CodeOutput(output=_literal(result.value), logs=logs, is_final_answer=False)

    def _revive(self) -> None:
        """A fresh interpreter after a crash: prelude, tools and the variables sent so far."""
        assert self._session is not None
        self._session.reset()
        self._session.execute(_PRELUDE).raise_for_error()
        for name in self._tools:
            if name != "final_answer":
                self._session.execute(f"_sqbox_define_tool({name!r})").raise_for_error()
        self._hand_in(self._session, {name: _pickled(name, value)
                                      for name, value in self._variables.items()})

    def _ephemeral_step(self, code: str) -> CodeOutput:
        carried = dict(self._variables, **self._state)
        payload = {name: _pickled(name, value) for name, value in carried.items()}
        with self._open_session() as session:
            logs = self._hand_in(session, payload)
            try:
                return self._step(session, code, logs)
            finally:
                self._state = self._collect(session)

    def _collect(self, session: sqbox.Session) -> Dict[str, Any]:
        """The step's globals as the sandbox encoded them, decoded without unpickling."""
        try:
            result = session.execute(f"_sqbox_collect({_STATE_PATH!r})")
            if result.error is not None:
                return self._state
            encoded = json.loads(session.get(_STATE_PATH))
        except (sqbox.SqboxError, ValueError):
            return self._state  # the step killed its interpreter: the state before it stays
        if not isinstance(encoded, dict):
            return self._state
        return {name: decode_value(value) for name, value in encoded.items()
                if isinstance(name, str) and name.isidentifier()}

    @staticmethod
    def _missing(session: sqbox.Session, names: List[str]) -> List[str]:
        result = session.execute(f"_sqbox_missing({names!r})")
        result.raise_for_error()
        missing = _literal(result.value)
        if not isinstance(missing, list) or not all(isinstance(n, str) for n in missing):
            raise ExecutionError(f"unexpected answer about the image's packages: {result.value}")
        return missing

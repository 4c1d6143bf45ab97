"""A Python executor for smolagents-style code agents, backed by a sqbox session.

`SqboxPythonExecutor` has the shape of smolagents' `LocalPythonExecutor`:
`send_variables(dict)`, `send_tools(dict of callables)` and
`executor(code_action) -> (output, logs, is_final_answer)`. The agent's code runs in a real
Python interpreter inside a sandbox, keeping its state across steps; tools stay on the host
and are called from inside through sqbox's tool calls. Calling `final_answer(x)` ends the
step and marks it final, as in smolagents.

Run the demo:  SQBOX_BIN=build/sqbox python3 python/examples/smolagents_executor.py [IMAGE]
(IMAGE defaults to $SQBOX_PYTHON_IMAGE).
"""
from __future__ import annotations

import ast
import os
import pickle
import sys
import threading
from typing import Any, Callable, Dict, NamedTuple, Optional

import sqbox

# Defined inside the sandbox once: final_answer() reports the value to the host (a tool call),
# then stops the step by raising, like smolagents' FinalAnswerException.
_PRELUDE = '''
class FinalAnswerException(BaseException):
    """Ends the step (a BaseException, so that `except Exception` in agent code lets it by)."""

def final_answer(answer):
    tools.final_answer(answer)
    raise FinalAnswerException()
'''

_VARIABLES_PATH = "/tmp/.smolagents_variables.pkl"


class CodeOutput(NamedTuple):
    """What one step produced: unpacks as (output, logs, is_final_answer)."""

    output: Any
    logs: str
    is_final_answer: bool


class ExecutionError(RuntimeError):
    """The agent's code raised; the message carries the logs and the traceback."""


class SqboxPythonExecutor:
    """Runs agent code in a persistent sqbox session. Use as a context manager or close()."""

    def __init__(self, image: str, *, timeout: float = 30.0, binary: Optional[str] = None,
                 sandbox: Optional[sqbox.Sandbox] = None) -> None:
        self._own_sandbox = sandbox is None
        self._sandbox = sandbox or sqbox.Sandbox(image, binary=binary)
        # Steps run one at a time; the final answer of the step in progress lands here.
        self._step_lock = threading.Lock()
        self._final_answer: Any = None
        try:
            self._session = self._sandbox.session(
                timeout=timeout, tools={"final_answer": self._record_final_answer})
            self._session.execute(_PRELUDE).raise_for_error()
        except BaseException:
            if self._own_sandbox:
                self._sandbox.close()
            raise

    def send_variables(self, variables: Dict[str, Any]) -> None:
        """Make these values globals of the agent's namespace (pickled across)."""
        self._session.put(_VARIABLES_PATH, pickle.dumps(variables, protocol=4))
        self._session.execute(
            f"import pickle as _pickle\n"
            f"globals().update(_pickle.load(open({_VARIABLES_PATH!r}, 'rb')))"
        ).raise_for_error()

    def send_tools(self, tools: Dict[str, Callable[..., Any]]) -> None:
        """Register host callables as tools; the agent calls them by name, e.g. `search(q)`."""
        for name, fn in tools.items():
            if name == "final_answer":
                continue  # handled by the executor itself
            self._session.register_tool(fn, name=name)
            # A plain global function inside, so the agent's code reads like smolagents code.
            self._session.execute(
                f"def {name}(*args, **kwargs):\n"
                f"    return tools.{name}(*args, **kwargs)").raise_for_error()

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one step of agent code; returns (output, logs, is_final_answer).

        `output` is the final answer if `final_answer()` was called, else the value of the
        trailing expression (as a Python literal where possible, else its repr).
        Raises `ExecutionError` if the code raised.
        """
        with self._step_lock:
            self._final_answer = None
            result = self._session.execute(code_action)
            final_answer = self._final_answer
        logs = result.stdout + result.stderr
        if result.error is not None and result.error.type == "FinalAnswerException":
            return CodeOutput(final_answer, logs, True)
        if result.timed_out:
            raise ExecutionError(f"{logs}Code execution timed out")
        if result.error is not None:
            raise ExecutionError(f"{logs}{result.error.traceback or result.error.message}")
        return CodeOutput(_literal(result.value), logs, False)

    def _record_final_answer(self, answer: Any) -> None:
        # The host tool behind final_answer(): runs in a tool worker thread while the step's
        # __call__ waits for its execute() to finish.
        self._final_answer = answer

    def close(self) -> None:
        """Close the session (and the sandbox, if this executor made it)."""
        self._session.close()
        if self._own_sandbox:
            self._sandbox.close()

    def __enter__(self) -> "SqboxPythonExecutor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _literal(value: Optional[str]) -> Any:
    if value is None:
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def get_weather(city: str) -> str:
    """A host-side tool: in a real agent it would call an API the sandbox cannot reach."""
    return f"Sunny in {city}, 21 °C"


def demo(image: str) -> None:
    with SqboxPythonExecutor(image, timeout=10) as executor:
        executor.send_variables({"numbers": [1, 2, 3, 4, 5]})
        executor.send_tools({"get_weather": get_weather})
        steps = [
            "total = sum(numbers)\nprint('total is', total)",
            "report = get_weather('Paris')\nprint(report)\nlen(report)",
            "final_answer(total * 2)",
        ]
        for step in steps:
            output, logs, is_final = executor(step)
            print(f"step output={output!r} logs={logs!r}")
            if is_final:
                print(f"final answer: {output} (is_final_answer={is_final})")
                break


if __name__ == "__main__":
    image_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SQBOX_PYTHON_IMAGE")
    if not image_path:
        sys.exit("usage: smolagents_executor.py IMAGE (or set $SQBOX_PYTHON_IMAGE)")
    demo(image_path)

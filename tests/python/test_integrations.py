"""sqbox.integrations: the smolagents executor and the torchforge coder actor.

Neither framework can be installed here, so their interfaces are pinned as their sources have
them, and agent-like loops run through both integrations against the real binary and image:
- smolagents: huggingface/smolagents at e3a5b8994b301983b91c0325546e9dc82eab8cf0,
  src/smolagents/remote_executors.py (RemotePythonExecutor) and local_python_executor.py
  (PythonExecutor, CodeOutput);
- torchforge: meta-pytorch/torchforge at 6e77f0b37596ef4d4f31924fbc46eb77d0c8043d,
  src/forge/actors/coder.py (SandboxedPythonCoder).
"""
import asyncio
import dataclasses
import inspect
import os
import re
import subprocess
import sys
import textwrap
import typing

import pytest
from conftest import ROOT

from sqbox.integrations import monarch as monarch_integration
from sqbox.integrations import smolagents as smolagents_integration
from sqbox.integrations.monarch import SandboxedPythonCoder
from sqbox.integrations.smolagents import (CodeOutput, ExecutionError, SandboxValue,
                                           SqboxExecutor)


def _parameter_names(function):
    return [name for name in inspect.signature(function).parameters if name != "self"]


# ---------------------------------------------------------------------------------------------
# The interfaces, as the frameworks define them


def test_executor_has_the_methods_of_smolagents_remote_executors():
    # RemotePythonExecutor: send_tools(self, tools), send_variables(self, variables),
    # __call__(self, code_action) -> CodeOutput, run_code_raise_errors(self, code),
    # install_packages(self, additional_imports) -> list, and cleanup(self) on every executor;
    # agents call send_variables(variables=...) by keyword (agents.py).
    assert _parameter_names(SqboxExecutor.send_tools) == ["tools"]
    assert _parameter_names(SqboxExecutor.send_variables) == ["variables"]
    assert _parameter_names(SqboxExecutor.__call__) == ["code_action"]
    assert _parameter_names(SqboxExecutor.run_code_raise_errors) == ["code"]
    assert _parameter_names(SqboxExecutor.install_packages) == ["additional_imports"]
    assert _parameter_names(SqboxExecutor.cleanup) == []
    # Remote executors are made as cls(additional_imports, logger, ...): ours takes the image
    # first, then the same two.
    assert _parameter_names(SqboxExecutor.__init__)[:3] == ["image", "additional_imports",
                                                            "logger"]
    assert smolagents_integration.FINAL_ANSWER_EXCEPTION == "FinalAnswerException"


def test_code_output_is_smolagents_dataclass():
    # local_python_executor.py: @dataclass class CodeOutput: output, logs, is_final_answer.
    assert dataclasses.is_dataclass(CodeOutput)
    assert [f.name for f in dataclasses.fields(CodeOutput)] == ["output", "logs",
                                                                "is_final_answer"]


def test_coder_has_torchforge_endpoints():
    # coder.py: async setup(self), async recreate(self), async execute(self, code: str) ->
    # tuple[str, str]; each an @endpoint of the actor.
    for name in ("setup", "recreate", "reset", "close"):
        method = getattr(SandboxedPythonCoder, name)
        assert inspect.iscoroutinefunction(method), name
        assert _parameter_names(method) == [], name
    assert inspect.iscoroutinefunction(SandboxedPythonCoder.execute)
    assert _parameter_names(SandboxedPythonCoder.execute) == ["code"]
    hints = typing.get_type_hints(SandboxedPythonCoder.execute, vars(monarch_integration))
    assert hints["return"] == typing.Tuple[str, str]


FAKE_SMOLAGENTS = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

@dataclass
class CodeOutput:
    output: Any
    logs: str
    is_final_answer: bool

class PythonExecutor(ABC):
    @abstractmethod
    def send_tools(self, tools): ...
    @abstractmethod
    def send_variables(self, variables): ...
    @abstractmethod
    def __call__(self, code_action): ...
'''

FAKE_MONARCH = '''
class Actor:
    pass

def endpoint(fn):
    fn.is_endpoint = True
    return fn
'''


def _run_with_fake_packages(tmp_path, files, script, sqbox_bin, python_image):
    for relative, text in files.items():
        path = tmp_path / "fake" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = dict(os.environ, SQBOX_BIN=sqbox_bin, SQBOX_PYTHON_IMAGE=python_image,
               PYTHONPATH=f"{tmp_path / 'fake'}:{ROOT / 'python'}")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_with_smolagents_installed_the_executor_is_one_of_its_executors(
        tmp_path, sqbox_bin, python_image):
    """Its PythonExecutor base (abstract methods and all) and its CodeOutput are used."""
    done = _run_with_fake_packages(tmp_path, {
        "smolagents/__init__.py": "",
        "smolagents/local_python_executor.py": FAKE_SMOLAGENTS,
    }, """
        import os
        from smolagents.local_python_executor import CodeOutput, PythonExecutor
        from sqbox.integrations.smolagents import SqboxExecutor
        with SqboxExecutor(os.environ["SQBOX_PYTHON_IMAGE"]) as executor:
            assert isinstance(executor, PythonExecutor)
            output = executor("6 * 7")
            assert type(output) is CodeOutput and output.output == 42, output
        print("ok")
    """, sqbox_bin, python_image)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_with_monarch_installed_the_coder_is_an_actor_with_endpoints(
        tmp_path, sqbox_bin, python_image):
    done = _run_with_fake_packages(tmp_path, {
        "monarch/__init__.py": "",
        "monarch/actor.py": FAKE_MONARCH,
    }, """
        from monarch.actor import Actor
        from sqbox.integrations.monarch import SandboxedPythonCoder
        assert issubclass(SandboxedPythonCoder, Actor)
        for name in ("setup", "execute", "recreate", "reset", "close"):
            assert getattr(SandboxedPythonCoder, name).is_endpoint, name
        print("ok")
    """, sqbox_bin, python_image)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


# ---------------------------------------------------------------------------------------------
# smolagents: an agent's loop


@pytest.fixture
def secret_tool():
    """A host tool holding a secret the sandbox never sees; records its calls."""
    calls = []
    secret = "host-only-secret-3f9a0"

    def lookup(key, *, upper=False):
        calls.append((key, upper))
        answer = f"value of {key} (authorised by {len(secret)}-char key)"
        return answer.upper() if upper else answer

    lookup.calls = calls
    lookup.secret = secret
    return lookup


def test_persistent_agent_loop(sandbox, secret_tool):
    with SqboxExecutor(sandbox=sandbox, timeout=20) as executor:
        executor.send_variables(variables={"numbers": [1, 2, 3, 4], "pair": (1, "a")})
        executor.send_tools({"lookup": secret_tool})

        step = executor("total = sum(numbers)\nprint('total', total)\ntype(pair).__name__")
        assert (step.output, step.logs, step.is_final_answer) == ("tuple", "total 10\n", False)

        step = executor("found = lookup('k', upper=True)\nprint(found)\nfound")
        assert step.output == "VALUE OF K (AUTHORISED BY 22-CHAR KEY)"
        assert secret_tool.calls == [("k", True)]
        assert secret_tool.secret not in executor("import os\nstr(dict(os.environ))").output

        # An exception of the code is an ExecutionError with the logs and the traceback; the
        # interpreter and its state survive it.
        with pytest.raises(ExecutionError) as raised:
            executor("print('before')\ntotal / 0")
        assert "before\n" in str(raised.value)
        assert "ZeroDivisionError: division by zero" in str(raised.value)
        assert executor("total").output == 10

        with pytest.raises(ExecutionError, match="timed out"):
            executor("while True: pass")
        assert executor("total + 1").output == 11

        # final_answer() ends the step even inside `except Exception`.
        step = executor("try:\n    final_answer({'total': total})\nexcept Exception:\n"
                        "    print('swallowed')\nprint('after')")
        assert (step.output, step.logs, step.is_final_answer) == ({"total": 10}, "", True)


def test_final_answer_tool_of_the_agent_is_applied_on_the_host(sandbox):
    seen = []

    def final_answer(answer):
        seen.append(answer)
        return f"checked: {answer}"

    with SqboxExecutor(sandbox=sandbox) as executor:
        executor.send_tools({"final_answer": final_answer})
        step = executor("final_answer(7)")
    assert (step.output, step.is_final_answer, seen) == ("checked: 7", True, [7])


def test_values_that_are_not_json_come_back_as_sandbox_values(sandbox):
    with SqboxExecutor(sandbox=sandbox) as executor:
        step = executor("final_answer((1, 2, b'x'))")
        assert step.is_final_answer
        value = step.output
        assert isinstance(value, SandboxValue)
        assert (value.type, value.repr) == ("builtins.tuple", "(1, 2, b'x')")
        assert isinstance(value.pickle, bytes)
        # Handed back in, it is unpickled inside the sandbox.
        executor.send_variables({"back": value})
        assert executor("back[2]").output == b"x"

        generator = executor("final_answer(x for x in [])").output
        assert generator.type == "builtins.generator" and generator.pickle is None
        with pytest.raises(ValueError, match="could not be pickled"):
            executor.send_variables({"gen": generator})


def test_a_crashed_interpreter_is_an_error_and_the_next_step_starts_fresh(sandbox, secret_tool):
    with SqboxExecutor(sandbox=sandbox, timeout=20) as executor:
        executor.send_variables({"kept": 5})
        executor.send_tools({"lookup": secret_tool})
        executor("lost = 1")
        with pytest.raises(ExecutionError, match="interpreter died"):
            executor("import os\nos._exit(3)")
        # Sent variables and tools are back, the step's own globals are not.
        assert executor("kept").output == 5
        assert executor("lookup('a')").output.startswith("value of a")
        with pytest.raises(ExecutionError, match="NameError"):
            executor("lost")


def test_install_packages_checks_the_image(sandbox):
    with SqboxExecutor(sandbox=sandbox) as executor:
        assert executor.install_packages(["json", "sqlite3"]) == ["json", "sqlite3"]
        with pytest.raises(ExecutionError, match="no_such_module_1c2d"):
            executor.install_packages(["json", "no_such_module_1c2d"])
    with pytest.raises(ExecutionError, match="no_such_module_1c2d"):
        SqboxExecutor(sandbox=sandbox, additional_imports=["no_such_module_1c2d"])


def test_ephemeral_steps_share_only_the_variables_handed_in(sandbox, secret_tool):
    with SqboxExecutor(sandbox=sandbox, ephemeral=True, timeout=20) as executor:
        executor.send_variables({"numbers": [1, 2, 3]})
        executor.send_tools({"lookup": secret_tool})
        step = executor(textwrap.dedent("""
            import os, subprocess, sys
            total = sum(numbers)
            open('/tmp/left-behind', 'w').write('x')
            handle = open('/tmp/left-behind')
            def helper():
                return 1
            os.environ['LEFT'] = '1'
            subprocess.Popen(['sleep', '1000'])
            print(lookup('z'))
        """))
        assert step.logs == "value of z (authorised by 22-char key)\n"
        assert set(executor.state) == {"numbers", "total"}, executor.state

        probe = textwrap.dedent("""
            import os
            names = sorted(n for n in globals() if not n.startswith('_'))
            def cmdline(pid):
                try:
                    return open('/proc/%s/cmdline' % pid, 'rb').read()
                except OSError:
                    return b''
            sleeping = any(cmdline(p).startswith(b'sleep') for p in os.listdir('/proc')
                           if p.isdigit())
            (total, os.path.exists('/tmp/left-behind'), os.environ.get('LEFT'), names,
             sleeping)
        """)
        total, file_left, env_left, names, sleeping = executor(probe).output
        assert (total, file_left, env_left, sleeping) == (6, False, None, False)
        assert {"handle", "helper"}.isdisjoint(names)
        assert {"numbers", "total", "lookup", "final_answer"} <= set(names)

        step = executor("final_answer(total * 2)")
        assert (step.output, step.is_final_answer) == (12, True)


def test_ephemeral_step_that_raises_keeps_its_variables_and_reports_the_error(sandbox):
    with SqboxExecutor(sandbox=sandbox, ephemeral=True) as executor:
        with pytest.raises(ExecutionError, match="KeyError"):
            executor("partial = 'set before the error'\n{}['missing']")
        assert executor("partial").output == "set before the error"


HOSTILE_CLASS = """
class Evil:
    def __reduce__(self):
        return (exec, ("open({marker!r}, 'w').write('code ran')",))
"""


def _pickle_is_live(data, marker):
    """The payload does run when unpickled (in a separate host process): the test's marker
    would appear if the executor unpickled it."""
    subprocess.run([sys.executable, "-c",
                    "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=data, check=True)
    ran = marker.exists()
    marker.unlink()
    return ran


def test_hostile_pickles_from_the_sandbox_never_run_on_the_host(sandbox, tmp_path):
    marker = tmp_path / "unpickled-on-the-host"
    hostile = HOSTILE_CLASS.format(marker=str(marker))
    with SqboxExecutor(sandbox=sandbox) as executor:
        executor(hostile)
        answer = executor("final_answer(Evil())").output
        assert isinstance(answer, SandboxValue) and answer.type == "__main__.Evil"
        # A forged answer, straight to the host tool.
        forged = executor("import base64, pickle\n"
                          "tools.final_answer({'type': 'x', 'repr': 'y', 'pickle': "
                          "base64.b64encode(pickle.dumps(Evil())).decode()})\n"
                          "raise FinalAnswerException()").output
        # A pickle as the trailing expression's value: bytes, not an object.
        raw = executor("import pickle\npickle.dumps(Evil())").output
        assert not marker.exists()
        assert isinstance(forged, SandboxValue) and isinstance(raw, bytes)
        for data in (answer.pickle, forged.pickle, raw):
            assert _pickle_is_live(data, marker)

    with SqboxExecutor(sandbox=sandbox, ephemeral=True) as executor:
        executor(hostile + "evil = Evil()\n")
        carried = executor.state["evil"]
        assert isinstance(carried, SandboxValue)
        # The next step unpickles it inside its own sandbox (where the marker's directory does
        # not exist), not on the host.
        step = executor("'evil' in globals()")
        assert step.output is False and "could not be restored" in step.logs
        # A step that writes the state file itself.
        executor(hostile + "import base64, json, pickle\n"
                 "def _sqbox_collect(path):\n"
                 "    json.dump({'evil': {'type': 't', 'repr': 'r', 'pickle': "
                 "base64.b64encode(pickle.dumps(Evil())).decode()}, 'bad': 5, 'x y': 1}, "
                 "open(path, 'w'))\n")
        assert set(executor.state) == {"evil", "bad"}
        assert isinstance(executor.state["evil"], SandboxValue)
        assert isinstance(executor.state["bad"], SandboxValue)  # malformed: kept opaque
        assert not marker.exists()
        assert _pickle_is_live(executor.state["evil"].pickle, marker)


# ---------------------------------------------------------------------------------------------
# torchforge: the coder actor's loop


def test_coder_actor_loop(sqbox_bin, python_image):
    async def loop():
        coder = SandboxedPythonCoder(python_image, timeout=5, binary=sqbox_bin)
        with pytest.raises(RuntimeError, match="setup"):
            await coder.execute("1")
        await coder.setup()
        try:
            assert await coder.execute("x = 20\nprint(x + 1)") == ("21\n", "")
            assert await coder.execute("import sys\nprint(x * 2, file=sys.stderr)") == ("",
                                                                                       "40\n")
            out, err = await coder.execute("print('partial')\n1 / 0")
            assert out == "partial\n"
            assert err.startswith("Traceback") and err.endswith(
                "ZeroDivisionError: division by zero\n")
            out, err = await coder.execute("while True: pass")
            assert err.endswith("TimeoutError: execution exceeded 5 s\n")
            assert await coder.execute("print(x)") == ("20\n", "")
            out, err = await coder.execute("import os\nos._exit(1)")
            assert (out, "the interpreter died and was restarted" in err) == ("", True)
            assert await coder.execute("print('alive')") == ("alive\n", "")
            await coder.execute("y = 1")
            await coder.recreate()
            out, err = await coder.execute("print(y)")
            assert err.endswith("NameError: name 'y' is not defined\n")
        finally:
            await coder.close()
        # Closed: usable again only after another setup().
        with pytest.raises(RuntimeError, match="setup"):
            await coder.execute("1")

    asyncio.run(loop())


# ---------------------------------------------------------------------------------------------
# The README's examples of this section run as written (the image name replaced)


def _readme_section_blocks(heading):
    text = (ROOT / "python" / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_agent_framework_examples_run(sqbox_bin, python_image, tmp_path):
    blocks = _readme_section_blocks("Agent frameworks")
    assert len(blocks) == 2
    for block in blocks:
        assert '"python.sqsh"' in block
        script = tmp_path / "example.py"
        script.write_text(block.replace('"python.sqsh"', repr(python_image)))
        env = dict(os.environ, SQBOX_BIN=sqbox_bin, PYTHONPATH=str(ROOT / "python"))
        done = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 0, (block, done.stderr)


"""The session driver's protocol logic (src/session/driver.py), without a sandbox.

The driver runs here as a plain subprocess of the host's Python, its stdin and stdout piped to
the test as they are to the server; sandboxed end-to-end sessions are tested elsewhere.
"""
import ast
import base64
import json
import os
import py_compile
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parents[2] / "src" / "session" / "driver.py"
# The interpreter that runs the driver: the host's, or any other, to check the versions the
# driver supports (3.8 to 3.13): SQBOX_DRIVER_PYTHON=python3.8 python3 -m pytest ...
PYTHON = os.environ.get("SQBOX_DRIVER_PYTHON") or (
    "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
TIMEOUT = 10


class Session:
    """One driver process; send() writes a request line, recv() reads one response line.

    As the server does, it gives the driver a token first and every request a sequence number
    (`seq`, unless the request has its own); recv() checks that each message carries the token
    and takes it out, and takes the `seq` out into `last_seq`."""

    def __init__(self, cwd, token="0123456789abcdef0123456789abcdef"):
        self.cwd = cwd
        self.proc = subprocess.Popen([PYTHON, str(DRIVER)], cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""
        self.token, self.seq, self.sent_seq, self.last_seq = token, 0, None, None
        self.send({"op": "hello", "token": token})
        self.ready = self.recv()

    def send(self, obj):
        if isinstance(obj, dict) and obj.get("op") not in ("hello", "tool_result") \
                and "seq" not in obj:
            self.seq += 1
            obj = dict(obj, seq=self.seq)
        if isinstance(obj, dict) and "seq" in obj:
            self.sent_seq = obj["seq"]
        line = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def recv(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([fd], [], [], left)[0], "no answer from the driver"
            chunk = os.read(fd, 1 << 20)
            assert chunk, "driver exited (status %s)" % self.proc.wait(TIMEOUT)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        message = json.loads(line)
        assert message.pop("token") == self.token, message
        self.last_seq = message.pop("seq", None)
        return message

    def quiet(self, seconds=0.2):
        """True if the driver writes nothing for this long."""
        return not self.buf and not select.select([self.proc.stdout], [], [], seconds)[0]

    def request(self, obj):
        self.send(obj)
        response = self.recv()
        assert response["event"] == "result", response
        assert self.last_seq == self.sent_seq, (self.last_seq, self.sent_seq)
        return response

    def exec(self, code, **fields):
        return self.request(dict(op="exec", code=code, **fields))

    def run(self, code):
        """exec that must succeed; returns the response."""
        response = self.exec(code)
        assert response["ok"] and response["error"] is None, response
        return response

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def session(tmp_path):
    s = Session(tmp_path)
    yield s
    s.close()


def wait_for(path):
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert time.monotonic() < deadline, "%s never appeared" % path
        time.sleep(0.01)


# Start and the basics of exec.

def test_ready_comes_first(session):
    assert session.ready["event"] == "ready"
    assert re.fullmatch(r"3\.\d+\.\d+\S*", session.ready["python"])


@pytest.mark.parametrize("first", [b'{"op": "exec", "code": "1"}\n', b'{"op": "hello"}\n',
                                   b'{"op": "hello", "token": 5}\n', b"not json\n"],
                         ids=["exec", "no-token", "token-not-a-string", "not-json"])
def test_without_a_hello_the_driver_exits(tmp_path, first):
    proc = subprocess.Popen([PYTHON, str(DRIVER)], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(first, timeout=TIMEOUT)
    assert proc.returncode == 1 and out == b"", (proc.returncode, out)
    assert b"hello" in err or b"JSON" in err


def test_every_message_carries_the_token_and_its_requests_number(session):
    # recv() checks the token; the numbers are the requests' own, whatever they are.
    session.request({"op": "tools", "names": ["t"], "seq": 41})
    assert session.last_seq == 41
    session.send({"op": "exec", "code": "tools.t()", "seq": 7})
    call = session.recv()
    assert call["event"] == "tool_call" and session.last_seq == 7
    session.send({"op": "tool_result", "call_id": call["call_id"], "result": 3})
    assert session.recv()["value"] == "3" and session.last_seq == 7
    # A request without a number is answered without one (the server would drop that answer).
    session.send(b'{"op": "get", "path": "nope"}\n')
    assert session.recv()["ok"] is False and session.last_seq is None


def test_state_persists_across_execs(session):
    session.run("x = 41\ndef f(y):\n    return y + 1")
    assert session.run("f(x)")["value"] == "42"


def test_trailing_expression_value(session):
    response = session.run("a = 'text'\na")
    assert response == {"event": "result", "ok": True, "stdout": "", "stderr": "",
                        "stdout_truncated": False, "stderr_truncated": False, "value": "'text'",
                        "error": None, "timed_out": False}
    assert session.run("1; 2")["value"] == "2"
    assert session.run("None")["value"] is None
    assert session.run("y = 3")["value"] is None
    assert session.run("")["value"] is None
    printed = session.run("print('shown')")  # print returns None: no value
    assert printed["stdout"] == "shown\n" and printed["value"] is None


def test_long_value_is_capped(session):
    value = session.run("'x' * 100000")["value"]
    assert value.startswith("'xxx") and value.endswith("...[truncated]")
    assert len(value) == 64 * 1024 + len("...[truncated]")


def test_user_namespace_is_a_real_main_module(session):
    code = ("import sys, pickle, dataclasses, sqbox_tools\n"
            "@dataclasses.dataclass\nclass Point:\n    x: int\n"
            "p = pickle.loads(pickle.dumps(Point(3)))\n"
            "(__name__, 'print' in dir(__builtins__), p, tools is sqbox_tools.tools,\n"
            " sys.modules['__main__'].p is p)")
    assert session.run(code)["value"] == "('__main__', True, Point(x=3), True, True)"


# Output capture.

def test_stdout_and_stderr_are_captured_at_both_levels(session):
    response = session.run("import os, sys\nprint('py-out')\nprint('py-err', file=sys.stderr)\n"
                           "os.system('echo from-child; echo child-err >&2')\n"
                           "sys.stdout.write('no newline')")
    assert response["stdout"] == "py-out\nfrom-child\nno newline"
    assert response["stderr"] == "py-err\nchild-err\n"
    # Each exec gets fresh files: nothing carries over.
    assert session.run("1")["stdout"] == ""


def test_output_is_capped(session):
    response = session.exec("import sys\nprint('a' * 100)\nprint('é' * 3, file=sys.stderr)",
                            output_limit=10)
    assert response["stdout"] == "a" * 10 and response["stdout_truncated"] is True
    assert response["stderr"] == "ééé\n" and response["stderr_truncated"] is False
    invalid = session.run("import os\nos.write(1, b'ok\\xff')")
    assert invalid["stdout"] == "ok\ufffd"


def test_user_code_sees_devnull_stdin_and_no_protocol_fds(session):
    response = session.run("import os\nos.system('exec ls /proc/self/fd')\n"
                           "os.readlink('/proc/self/fd/0'), input.__name__")
    # ls has its own 0-2 and the directory it lists: the driver's fds are close-on-exec.
    assert response["stdout"].split() == ["0", "1", "2", "3"]
    assert response["value"] == "('/dev/null', 'input')"
    assert session.exec("input()")["error"]["type"] == "EOFError"


# Errors in user code.

def test_exception_reports_user_lines_only(session):
    session.run("def fail(n):\n    raise ValueError('boom %d' % n)")
    response = session.exec("x = 1\nfail(x)")
    assert response["ok"] is True
    error = response["error"]
    assert error["type"] == "ValueError" and error["message"] == "boom 1"
    tb = error["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert 'File "<exec-2>", line 2' in tb and "fail(x)" in tb
    assert 'File "<exec-1>", line 2' in tb and "raise ValueError('boom %d' % n)" in tb
    assert "driver.py" not in tb and tb.endswith("ValueError: boom 1\n")


def test_chained_exception_traceback(session):
    tb = session.exec("try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('x') from e"
                      )["error"]["traceback"]
    assert "KeyError: 'k'" in tb and "direct cause" in tb and "driver.py" not in tb


def test_syntax_error(session):
    error = session.exec("def f(:\n    pass")["error"]
    assert error["type"] == "SyntaxError"
    assert "<exec-1>" in error["traceback"] and "def f(:" in error["traceback"]
    assert "driver.py" not in error["traceback"] and "ast.py" not in error["traceback"]
    assert session.exec("return 1")["error"]["type"] == "SyntaxError"


def test_system_exit_keeps_the_session(session):
    error = session.exec("import sys\nsys.exit(3)")["error"]
    assert error["type"] == "SystemExit" and error["message"] == "3"
    assert session.exec("exit()")["error"]["type"] == "SystemExit"
    assert session.run("2 + 2")["value"] == "4"
    assert session.proc.poll() is None


def test_base_exceptions_and_broken_repr(session):
    assert session.exec("raise GeneratorExit('g')")["error"]["type"] == "GeneratorExit"
    session.run("class Bad:\n    def __repr__(self):\n        raise TypeError('no repr')")
    assert session.exec("Bad()")["error"]["message"] == "no repr"
    assert session.run("'still alive'")["value"] == "'still alive'"


def test_exception_group(session):
    if tuple(map(int, session.ready["python"].split(".")[:2])) < (3, 11):
        pytest.skip("ExceptionGroup is Python 3.11+")
    error = session.exec("def inner():\n    raise ValueError('v')\n"
                         "try:\n    inner()\nexcept ValueError as e:\n"
                         "    raise ExceptionGroup('group', [e, KeyError('k')])")["error"]
    assert error["type"] == "ExceptionGroup" and "group" in error["message"]
    tb = error["traceback"]
    assert "inner()" in tb and "ValueError: v" in tb and "KeyError: 'k'" in tb
    assert "driver.py" not in tb


def test_undecodable_text_in_messages(session):
    error = session.exec("raise ValueError('bad \\udcff name')")["error"]
    assert error["message"] == "bad ? name"  # a lone surrogate is no valid JSON for strict parsers


def test_forked_child_does_not_answer(session):
    response = session.run("import os\npid = os.fork()\nif pid == 0:\n    print('child')\n"
                           "else:\n    os.waitpid(pid, 0)")
    assert response["stdout"] == "child\n"
    assert session.quiet() and session.run("'one answer'")["value"] == "'one answer'"


# SIGINT: the server's timeout.

def test_sigint_interrupts_running_code(session):
    session.send({"op": "exec", "code": "import time\nopen('started', 'w').close()\n"
                                        "print('before')\ntime.sleep(30)"})
    wait_for(session.cwd / "started")
    started = time.monotonic()
    session.proc.send_signal(signal.SIGINT)
    response = session.recv()
    assert time.monotonic() - started < 5
    assert response["ok"] is True and response["stdout"] == "before\n"
    assert response["error"]["type"] == "KeyboardInterrupt"
    assert "<exec-1>" in response["error"]["traceback"]
    assert "driver.py" not in response["error"]["traceback"]
    assert session.run("'after'")["value"] == "'after'"


def test_sigint_while_idle_is_ignored(session):
    for _ in range(3):
        session.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    assert session.quiet(0.1) and session.proc.poll() is None
    response = session.run("import time\ntime.sleep(0.2)\n'not interrupted'")
    assert response["value"] == "'not interrupted'"


def test_sigint_racing_the_end_of_exec(session):
    # Wherever a SIGINT lands (in the code, as it returns, while the driver reports or reads),
    # every exec gets exactly one answer, and the driver lives on.
    # The code takes about 1 ms; the signal comes 0 to 4 ms after the request.
    outcomes = set()
    for i in range(100):
        session.send({"op": "exec", "code": "sum(range(100000))"})
        time.sleep((i % 20) * 0.0002)
        session.proc.send_signal(signal.SIGINT)
        response = session.recv()
        assert response["ok"] is True, response
        outcomes.add(response["error"] and response["error"]["type"])
    assert outcomes <= {None, "KeyboardInterrupt"}
    assert session.quiet() and session.run("'alive'")["value"] == "'alive'"


def test_user_signal_handler_is_undone(session):
    session.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)")
    session.proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    assert session.proc.poll() is None and session.run("1")["value"] == "1"


# Tools.

def test_tool_call_round_trip(session):
    assert session.request({"op": "tools", "names": ["search", "lookup"]}) == {
        "event": "result", "ok": True}
    session.send({"op": "exec", "code": "r = [tools.search('q', k=3), tools.lookup()]\nr"})
    calls = []
    for result in (["a", "b"], {"n": None}):
        call = session.recv()
        calls.append(call)
        session.send({"op": "tool_result", "call_id": call["call_id"], "result": result})
    assert calls == [
        {"event": "tool_call", "call_id": "c1", "name": "search", "args": ["q"],
         "kwargs": {"k": 3}},
        {"event": "tool_call", "call_id": "c2", "name": "lookup", "args": [], "kwargs": {}}]
    assert session.recv()["value"] == "[['a', 'b'], {'n': None}]"
    assert session.run("sorted(dir(tools)), repr(tools)")["value"] == \
        "(['lookup', 'search'], '<sqbox tools: search, lookup>')"


def test_tool_error_is_raised_as_tool_error(session):
    session.request({"op": "tools", "names": ["search"]})
    code = ("import sqbox_tools\ntry:\n    tools.search('q')\n"
            "except sqbox_tools.ToolError as e:\n    caught = (e.type, e.message, str(e))\n"
            "tools.search('again')")
    session.send({"op": "exec", "code": code})
    for _ in range(2):
        call = session.recv()
        session.send({"op": "tool_result", "call_id": call["call_id"],
                      "error": {"type": "ValueError", "message": "bad query"}})
    error = session.recv()["error"]
    assert error["type"] == "ToolError" and error["message"] == "ValueError: bad query"
    assert "tools.search('again')" in error["traceback"]
    assert "driver.py" not in error["traceback"]
    assert session.run("caught")["value"] == "('ValueError', 'bad query', 'ValueError: bad query')"


def test_tool_arguments_must_be_json(session):
    session.request({"op": "tools", "names": ["search"]})
    for args in ("object()", "float('nan')", "k={1, 2}"):
        error = session.exec("tools.search(%s)" % args)["error"]  # no tool_call comes first
        assert error["type"] == "TypeError" and "JSON" in error["message"]


def test_unknown_tool(session):
    error = session.exec("tools.search('q')")["error"]
    assert error["type"] == "AttributeError" and "search" in error["message"]
    session.request({"op": "tools", "names": ["lookup"]})
    error = session.exec("tools.search('q')")["error"]
    assert error["type"] == "AttributeError" and "lookup" in error["message"]


def test_tools_only_from_the_main_thread(session):
    session.request({"op": "tools", "names": ["search"]})
    response = session.run("import threading\nerrors = []\ndef call():\n    try:\n"
                           "        tools.search()\n    except RuntimeError as e:\n"
                           "        errors.append('main thread' in str(e))\n"
                           "t = threading.Thread(target=call)\nt.start()\nt.join()\nerrors")
    assert response["value"] == "[True]"


def test_stale_tool_result_gets_no_answer(session):
    # Like the client's tool_result (a request without id), and so that the server, which
    # forwards a late one while the next request runs, never takes an answer for that one's.
    session.send({"op": "tool_result", "call_id": "c1", "result": 1})
    assert session.quiet()
    assert session.run("'next'")["value"] == "'next'"


def test_requests_during_a_tool_call_wait_for_the_code(session):
    # The server sends none while code runs, unless a result forged by the code made it take the
    # exec for answered: the requests that follow then still get their own answers, in order.
    session.request({"op": "tools", "names": ["slow"]})
    session.send({"op": "exec", "code": "tools.slow()"})
    exec_seq = session.seq
    call = session.recv()
    assert call["event"] == "tool_call"
    session.send({"op": "put", "path": "f", "data_b64": base64.b64encode(b"x").decode()})
    session.send({"op": "exec", "code": "open('f').read()"})
    session.send({"op": "nope"})
    assert session.quiet()
    session.send({"op": "tool_result", "call_id": "c99", "result": 0})  # stale: no answer
    session.send({"op": "tool_result", "call_id": call["call_id"], "result": 5})
    answers = [(session.recv(), session.last_seq) for _ in range(4)]
    assert [seq for _, seq in answers] == list(range(exec_seq, exec_seq + 4))
    assert answers[0][0]["value"] == "5"
    assert answers[1][0] == {"event": "result", "ok": True}
    assert answers[2][0]["value"] == "'x'"
    assert answers[3][0]["error"]["type"] == "BadRequest"
    assert session.quiet()


def test_sigint_during_a_tool_call(session):
    session.request({"op": "tools", "names": ["slow"]})
    session.send({"op": "exec", "code": "tools.slow()"})
    call = session.recv()
    session.proc.send_signal(signal.SIGINT)
    assert session.recv()["error"]["type"] == "KeyboardInterrupt"
    session.send({"op": "tool_result", "call_id": call["call_id"], "result": 1})  # too late
    assert session.run("'fine'")["value"] == "'fine'"
    # The next call has a new id: the late answer above cannot be taken for it.
    session.send({"op": "exec", "code": "tools.slow()"})
    assert session.recv()["call_id"] != call["call_id"]


def test_sigint_racing_a_tool_result(session):
    # The interrupt comes as the answer arrives: the exec ends either way with one answer, and
    # the next exec's answer comes next.
    session.request({"op": "tools", "names": ["t"]})
    outcomes = set()
    for i in range(60):
        session.send({"op": "exec", "code": "tools.t(%d) + sum(range(10000))" % i})
        call = session.recv()
        assert call["event"] == "tool_call" and call["args"] == [i]
        session.send({"op": "tool_result", "call_id": call["call_id"], "result": 0})
        time.sleep((i % 10) * 0.0001)
        session.proc.send_signal(signal.SIGINT)
        response = session.recv()
        assert response["ok"] is True, response
        outcomes.add(response["error"] and response["error"]["type"])
        assert session.run("'next'")["value"] == "'next'"
    assert outcomes <= {None, "KeyboardInterrupt"}
    assert session.quiet()


def test_eof_during_a_tool_call_exits(session):
    session.request({"op": "tools", "names": ["slow"]})
    session.send({"op": "exec", "code": "tools.slow()"})
    session.recv()
    session.proc.stdin.close()
    assert session.proc.wait(TIMEOUT) == 0


# put and get.

def test_put_get_round_trip(session):
    data = bytes(range(256)) * 40
    put = session.request({"op": "put", "path": "blob.bin",
                           "data_b64": base64.b64encode(data).decode()})
    assert put == {"event": "result", "ok": True}
    assert (session.cwd / "blob.bin").read_bytes() == data
    assert session.run("len(open('blob.bin', 'rb').read())")["value"] == str(len(data))
    got = session.request({"op": "get", "path": str(session.cwd / "blob.bin")})
    assert got["ok"] is True and base64.b64decode(got["data_b64"]) == data
    small = session.request({"op": "get", "path": "blob.bin", "limit": 100})
    assert small["ok"] is False and small["error"]["type"] == "TooLarge"


def test_put_get_errors(session):
    missing = session.request({"op": "get", "path": "nope"})
    assert missing["ok"] is False and missing["error"]["type"] == "FileNotFoundError"
    no_dir = session.request({"op": "put", "path": "no/such/dir", "data_b64": ""})
    assert no_dir["ok"] is False and no_dir["error"]["type"] == "FileNotFoundError"
    bad = session.request({"op": "put", "path": "f", "data_b64": "not base64!"})
    assert bad["error"]["type"] == "BadRequest"
    assert session.request({"op": "get"})["error"]["type"] == "BadRequest"


def test_put_too_large(session):
    data = base64.b64encode(b"\0" * ((64 << 20) + 1)).decode()
    response = session.request({"op": "put", "path": "big", "data_b64": data})
    assert response["ok"] is False and response["error"]["type"] == "TooLarge"
    assert not (session.cwd / "big").exists()


# Bad input and the end.

BAD_LINES = {"not-json": b"{not json\n", "not-an-object": b"[1, 2]\n",
             "unknown-op": b'{"op": "launch"}\n', "no-code": b'{"op": "exec"}\n',
             "code-not-a-string": b'{"op": "exec", "code": 1}\n', "not-utf8": b"\xff\xfe\n",
             "too-deep": b"[" * 100000 + b"\n"}


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_bad_requests(session, line):
    session.send(line)
    response = session.recv()
    assert response["event"] == "result" and response["ok"] is False
    assert response["error"]["type"] == "BadRequest"
    assert session.run("'ok'")["value"] == "'ok'"


def test_eof_exits_zero(session):
    session.run("import threading, time\n"
                "threading.Thread(target=time.sleep, args=(30,)).start()")  # must not hold it
    session.proc.stdin.close()
    assert session.proc.wait(TIMEOUT) == 0


# Compatibility: the driver must run on Python 3.8 to 3.13; only 3.11 is installed here.

def test_driver_compiles_and_parses_as_python_3_8(tmp_path):
    py_compile.compile(str(DRIVER), cfile=str(tmp_path / "driver.pyc"), doraise=True)
    tree = ast.parse(DRIVER.read_text(), feature_version=(3, 8))
    # Newer than 3.8 and not caught by feature_version: str methods, generic builtins.
    newer = {"removeprefix", "removesuffix", "is_relative_to", "bit_count", "with_stem"}
    assert not [node.attr for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr in newer]
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.AnnAssign, ast.arg))
                and getattr(node, "annotation", None) is not None]
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.BitOr) and isinstance(node.left, ast.Dict)]

"""The session driver's streamed output and background processes (PROTOCOL.md, "Streaming
output" and "Background processes"), run directly with the host's Python as test_driver.py
does."""
import time

import pytest

from test_driver import TIMEOUT, Session, wait_for


@pytest.fixture
def session(tmp_path):
    s = Session(tmp_path)
    yield s
    s.close()


def collect(session):
    """The output events of the exec just sent, up to its result: (events, result)."""
    events = []
    while True:
        message = session.recv()
        if message["event"] != "output":
            assert message["event"] == "result", message
            assert session.last_seq == session.sent_seq
            return events, message
        assert session.last_seq == session.sent_seq, message  # the exec's own number
        events.append((message["stream"], message["data"]))


def joined(events, stream):
    return "".join(data for name, data in events if name == stream)


# Streaming

def test_output_arrives_while_the_code_runs(session, tmp_path):
    # The code waits for a file that the test makes only once it has the first event: without
    # events before the end, the exec would time out.
    go = tmp_path / "go"
    session.send({"op": "exec", "stream": True, "code":
                  "import os, sys, time\nprint('first', flush=True)\n"
                  f"deadline = time.time() + {TIMEOUT}\n"
                  f"while not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
                  "    time.sleep(0.01)\n"
                  f"print('second' if os.path.exists({str(go)!r}) else 'no event came')"})
    first = session.recv()
    assert (first["event"], first["stream"], first["data"]) == ("output", "stdout", "first\n")
    go.touch()
    events, result = collect(session)
    assert joined([("stdout", "first\n")] + events, "stdout") == result["stdout"] == \
        "first\nsecond\n"


def test_both_streams_and_subprocesses_are_streamed(session):
    session.send({"op": "exec", "stream": True, "code":
                  "import os, sys, subprocess\nprint('py out')\nprint('py err', file=sys.stderr)\n"
                  "subprocess.run(['sh', '-c', 'echo sh out; echo sh err >&2'])\n"
                  "os.write(2, b'fd err\\n')"})
    events, result = collect(session)
    assert joined(events, "stdout") == result["stdout"] == "py out\nsh out\n"
    assert joined(events, "stderr") == result["stderr"] == "py err\nsh err\nfd err\n"


def test_a_character_split_between_writes_is_never_split_in_events(session):
    session.send({"op": "exec", "stream": True, "code":
                  "import os, time\nos.write(1, b'a\\xc3')\ntime.sleep(0.2)\n"
                  "os.write(1, b'\\xa9b\\xff')"})
    events, result = collect(session)
    assert all("\ufffd" not in data for name, data in events[:-1]), events
    assert joined(events, "stdout") == result["stdout"] == "a\u00e9b\ufffd"


def test_streamed_output_stops_at_the_output_limit(session):
    session.send({"op": "exec", "stream": True, "output_limit": 1000,
                  "code": "print('x' * 100000)"})
    events, result = collect(session)
    assert joined(events, "stdout") == result["stdout"] == "x" * 1000
    assert result["stdout_truncated"] is True


def test_without_stream_there_are_no_events(session):
    response = session.exec("print('quiet')")  # request() asserts the first message is the result
    assert response["stdout"] == "quiet\n"


def test_streaming_exec_keeps_tools_and_interrupts_working(session):
    session.request({"op": "tools", "names": ["t"]})
    session.send({"op": "exec", "stream": True, "code": "print('before')\nprint(tools.t())"})
    events = []
    while True:
        message = session.recv()
        if message["event"] == "tool_call":
            break
        events.append((message["stream"], message["data"]))
    session.send({"op": "tool_result", "call_id": message["call_id"], "result": "from host"})
    more, result = collect(session)
    assert joined(events + more, "stdout") == result["stdout"] == "before\nfrom host\n"


def test_a_fork_of_streaming_code_does_not_stream(session):
    session.send({"op": "exec", "stream": True, "code":
                  "import os\nprint('parent', flush=True)\npid = os.fork()\n"
                  "if pid == 0:\n    print('child', flush=True)\nelse:\n    os.waitpid(pid, 0)"})
    events, result = collect(session)
    assert joined(events, "stdout") == result["stdout"] == "parent\nchild\n"
    assert session.quiet()


def test_a_streaming_exec_gives_its_display_data_in_its_result(session):
    session.send({"op": "exec", "stream": True, "code":
                  "print('before', flush=True)\ndisplay({'a': 1})\nclass T:\n"
                  "    def _repr_html_(self):\n        return '<b>t</b>'\n"
                  "    def __repr__(self):\n        return 'T()'\nprint('after')\nT()"})
    events, result = collect(session)
    assert joined(events, "stdout") == result["stdout"] == "before\nafter\n"
    assert joined(events, "stderr") == result["stderr"] == ""
    assert result["value"] == "T()"
    assert [item["data"] for item in result["display"]] == [
        {"text/plain": "{'a': 1}"}, {"text/html": "<b>t</b>", "text/plain": "T()"}]
    # The next exec, streamed or not, starts without the last one's display data.
    session.send({"op": "exec", "stream": True, "code": "print(1)"})
    assert "display" not in collect(session)[1]


# Background processes

def start(session, command, **fields):
    response = session.request(dict(op="process_start", command=command, **fields))
    assert response["ok"] is True, response
    return response["process"]


def test_background_process_output_is_read_later_and_waited_for(session, tmp_path):
    name = start(session, ["sh", "-c", "echo out; echo err >&2; while [ ! -e go ]; do "
                           "sleep 0.01; done; echo \"$GREETING\" from $(pwd)"],
                 env={"GREETING": "hello"}, workdir=str(tmp_path))
    deadline = time.monotonic() + TIMEOUT
    out = err = ""
    while out != "out\n" or err != "err\n":
        assert time.monotonic() < deadline, (out, err)
        read = session.request({"op": "process_read", "process": name})
        assert read["running"] is True and read["exit_code"] is None, read
        out, err = out + read["stdout"], err + read["stderr"]
    # Meanwhile the session runs code.
    assert session.run("6 * 7")["value"] == "42"
    (tmp_path / "go").touch()
    waited = session.request({"op": "process_wait", "process": name, "timeout": TIMEOUT})
    assert (waited["running"], waited["exit_code"], waited["signal"]) == (False, 0, None)
    read = session.request({"op": "process_read", "process": name})
    assert (read["stdout"], read["stderr"]) == (f"hello from {tmp_path}\n", "")
    assert session.request({"op": "process_read", "process": name})["stdout"] == ""


def test_wait_with_a_timeout_returns_while_it_runs_and_kill_ends_its_group(session, tmp_path):
    pid_file = tmp_path / "grandchild"
    name = start(session, ["sh", "-c", f"sleep 1000 & echo $! > {pid_file}; wait"])
    waited = session.request({"op": "process_wait", "process": name, "timeout": 0.1})
    assert waited["running"] is True and waited["exit_code"] is None
    wait_for(pid_file)
    grandchild = int(pid_file.read_text())
    killed = session.request({"op": "process_kill", "process": name})
    assert killed["ok"] is True
    waited = session.request({"op": "process_wait", "process": name, "timeout": TIMEOUT})
    assert (waited["exit_code"], waited["signal"]) == (128 + 9, 9)
    # The shell's child, in the same process group, got the signal too (it is the host's
    # process here, reaped by init or by pytest's process).
    deadline = time.monotonic() + TIMEOUT
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the group's other process survived the kill"
        time.sleep(0.01)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_kill_with_a_signal_of_choice(session):
    name = start(session, ["sleep", "1000"])
    session.request({"op": "process_kill", "process": name, "signal": 15})
    waited = session.request({"op": "process_wait", "process": name, "timeout": TIMEOUT})
    assert (waited["exit_code"], waited["signal"]) == (128 + 15, 15)


def test_read_limit_and_a_character_split_by_it(session):
    name = start(session, ["printf", "ab\\303\\251cd"])
    session.request({"op": "process_wait", "process": name, "timeout": TIMEOUT})
    first = session.request({"op": "process_read", "process": name, "limit": 3})
    assert (first["stdout"], first["stdout_pending"]) == ("ab", 3)
    second = session.request({"op": "process_read", "process": name, "limit": 3})
    assert (second["stdout"], second["stdout_pending"]) == ("\u00e9cd", 0)


def test_background_process_sees_no_protocol_descriptors(session):
    name = start(session, ["sh", "-c", "ls /proc/self/fd"])
    session.request({"op": "process_wait", "process": name, "timeout": TIMEOUT})
    fds = session.request({"op": "process_read", "process": name})["stdout"].split()
    assert sorted(fds) == ["0", "1", "2", "3"], fds  # 3: ls's own directory


@pytest.mark.parametrize("request_fields,error", [
    ({"op": "process_read", "process": "p99"}, "NoSuchProcess"),
    ({"op": "process_wait", "process": 5}, "BadRequest"),
    ({"op": "process_start", "command": []}, "BadRequest"),
    ({"op": "process_start", "command": ["sh"], "env": {"A": 1}}, "BadRequest"),
    ({"op": "process_start", "command": ["/nonexistent/program"]}, "FileNotFoundError"),
    ({"op": "process_kill", "process": "p1"}, "NoSuchProcess"),
])
def test_bad_process_requests(session, request_fields, error):
    response = session.request(request_fields)
    assert response["ok"] is False and response["error"]["type"] == error, response

"""The client against replies of the wrong form: a session's code can forge the reply to the
request it runs in (SECURITY.md), so every field is checked. A malformed reply becomes an error
result (execute) or a ProtocolError (the other calls), never an AttributeError, a TypeError or a
hang, and the client goes on working.

The server here is a fake `sqbox serve` (a small Python program given as binary=): it answers
ping and session_open as the real one does and answers every other request with the next reply
of a script the test writes. The end-to-end test at the bottom forges replies from inside a real
session instead.
"""
import asyncio
import json
import sys
import textwrap

import pytest

import sqbox

FAKE_SERVER = textwrap.dedent("""\
    import json, sys
    script = json.load(open(sys.argv[-1]))  # the "image" argument: the replies to give
    for line in sys.stdin:
        request = json.loads(line)
        op, rid = request.get("op"), request.get("id")
        if op == "ping":
            reply = {"ok": True, "version": "fake"}
        elif op == "session_open" and not script.get("open"):
            reply = {"ok": True, "session": "s1"}
        elif op == "shutdown":
            break
        elif op in ("close", "tool_result"):
            continue
        else:
            key = "open" if op == "session_open" else "replies"
            reply = script[key].pop(0)
            for raw in script.get("noise", []):  # lines that are no reply at all
                sys.stdout.write(raw + "\\n")
        if isinstance(reply, dict):
            reply = dict(reply, id=rid)
        sys.stdout.write(json.dumps(reply) + "\\n")
        sys.stdout.flush()
""")


@pytest.fixture
def fake_server(tmp_path):
    """A function that starts a Sandbox on the fake server with a script of replies."""
    program = tmp_path / "fake-sqbox"
    program.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    program.chmod(0o755)
    boxes = []

    def start(replies, **script):
        script_path = tmp_path / f"script-{len(boxes)}.json"
        script_path.write_text(json.dumps(dict(script, replies=replies)))
        box = sqbox.Sandbox(str(script_path), binary=str(program), start_timeout=10)
        boxes.append(box)
        return box

    yield start
    for box in boxes:
        box.close()


# Each is an exec reply as a forging session could make the server pass it on (the server sets
# id and timed_out itself, and ok when the driver's reply has none).
MALFORMED_EXEC_REPLIES = {
    "error-a-string": {"ok": True, "error": "boom", "timed_out": False},
    "error-a-list": {"ok": True, "error": ["boom"], "timed_out": False},
    "error-type-a-number": {"ok": True, "error": {"type": 5, "message": "m"}, "timed_out": False},
    "error-message-an-object": {"ok": True, "error": {"type": "E", "message": {}},
                                "timed_out": False},
    "traceback-a-number": {"ok": True, "error": {"type": "E", "message": "m", "traceback": 1},
                           "timed_out": False},
    "stdout-a-number": {"ok": True, "stdout": 5, "timed_out": False},
    "stderr-a-list": {"ok": True, "stderr": ["x"], "timed_out": False},
    "value-a-number": {"ok": True, "value": 42, "timed_out": False},
    "value-an-object": {"ok": True, "value": {"a": 1}, "timed_out": False},
    "truncated-a-number": {"ok": True, "stdout_truncated": 1, "timed_out": False},
    "timed-out-a-string": {"ok": True, "timed_out": "no"},
    "ok-a-string": {"ok": "true", "value": "'fine'", "timed_out": False},
    "ok-missing": {"value": "'fine'", "timed_out": False},
}


@pytest.mark.parametrize("reply", MALFORMED_EXEC_REPLIES.values(),
                         ids=MALFORMED_EXEC_REPLIES.keys())
def test_a_malformed_exec_reply_is_an_error_result(fake_server, reply):
    box = fake_server([reply, {"ok": True, "value": "'next'", "timed_out": False}])
    session = box.session()
    result = session.execute("anything", timeout=5)
    assert not result.ok
    assert result.error.type == "ProtocolError", result
    assert "malformed reply" in result.error.message
    assert result.value is None and result.stdout == "" and result.stderr == ""
    with pytest.raises(sqbox.SandboxExecError):
        result.raise_for_error()
    # The next request gets its own answer.
    assert session.execute("next", timeout=5).value == "'next'"


def test_a_well_formed_exec_reply_is_read_as_it_is(fake_server):
    box = fake_server([{"ok": True, "stdout": "o", "stderr": "e", "value": None,
                        "error": {"type": "ValueError", "message": "m", "traceback": None},
                        "timed_out": True, "stdout_truncated": True, "stderr_truncated": False}])
    result = box.session().execute("x", timeout=5)
    assert (result.stdout, result.stderr, result.value, result.timed_out) == ("o", "e", None, True)
    assert result.error == sqbox.ExecError(type="ValueError", message="m", traceback="")
    assert result.stdout_truncated is True and result.stderr_truncated is False


@pytest.mark.parametrize("reply", [
    {"ok": True, "data_b64": 5}, {"ok": True, "data_b64": ["aGk="]}, {"ok": True},
    {"ok": True, "data_b64": "not base64!"}, {"ok": True, "data_b64": "aGk"},
    {"ok": 1, "data_b64": "aGk="},
], ids=["number", "list", "missing", "not-base64", "bad-padding", "ok-a-number"])
def test_a_malformed_get_reply_raises_protocol_error(fake_server, reply):
    box = fake_server([reply, {"ok": True, "data_b64": "aGk="}])
    session = box.session()
    with pytest.raises(sqbox.ProtocolError, match="malformed reply"):
        session.get("/tmp/f")
    assert session.get("/tmp/f") == b"hi"


@pytest.mark.parametrize("reply", [
    {"ok": False, "error": "a string"}, {"ok": False, "error": 5}, {"ok": False},
    {"ok": False, "error": {"type": ["x"]}, "stderr": 7},
    {"ok": False, "session_dead": True, "error": "dead, as a string"},
    {"ok": False, "session_dead": True, "error": {"message": 5}},
], ids=["error-a-string", "error-a-number", "no-error", "type-a-list", "dead-string",
        "dead-message-a-number"])
def test_failed_replies_with_odd_errors_raise_the_clients_errors(fake_server, reply):
    box = fake_server([reply])
    session = box.session()
    with pytest.raises(sqbox.SqboxError) as raised:
        session.put("/tmp/f", b"x")
    expected = sqbox.SessionDead if reply.get("session_dead") else sqbox.SqboxError
    assert type(raised.value) is expected


@pytest.mark.parametrize("reply", [
    {"ok": True, "exit_code": "0", "stdout_b64": "", "stderr_b64": ""},
    {"ok": True, "stdout_b64": "", "stderr_b64": ""},
    {"ok": True, "exit_code": 0, "stdout_b64": 5, "stderr_b64": ""},
    {"ok": True, "exit_code": 0, "stdout_b64": "%%%", "stderr_b64": ""},
    {"ok": True, "exit_code": 0, "stdout_b64": "", "stderr_b64": "", "timed_out": "no"},
    {"ok": True, "exit_code": 0, "stdout_b64": "", "stderr_b64": "", "signal": "9"},
    {"ok": True, "exit_code": 0, "stdout_b64": "", "stderr_b64": "", "wall_ms": "1"},
    {"ok": True, "exit_code": True, "stdout_b64": "", "stderr_b64": ""},
], ids=["exit-code-a-string", "no-exit-code", "stdout-a-number", "stdout-not-base64",
        "timed-out-a-string", "signal-a-string", "wall-a-string", "exit-code-a-bool"])
def test_a_malformed_run_reply_raises_protocol_error(fake_server, reply):
    box = fake_server([reply, {"ok": True, "exit_code": 3, "stdout_b64": "aGk=",
                               "stderr_b64": ""}])
    with pytest.raises(sqbox.ProtocolError):
        box.run(["x"])
    result = box.run(["x"])
    assert result.exit_code == 3 and result.stdout == "hi"


@pytest.mark.parametrize("reply", [{"ok": True, "session": 5}, {"ok": True},
                                   {"ok": True, "session": ["s1"]}],
                         ids=["number", "missing", "list"])
def test_a_malformed_session_open_reply_raises_protocol_error(fake_server, reply):
    box = fake_server([], open=[reply])
    with pytest.raises(sqbox.ProtocolError):
        box.session()


def test_lines_that_are_no_reply_are_dropped_and_the_reader_goes_on(fake_server):
    noise = ["not json", "[1]", "5", json.dumps({"id": True, "ok": True}),
             json.dumps({"id": [1], "ok": True}),
             json.dumps({"event": "tool_call", "session": ["s1"], "call_id": "c", "name": "t"}),
             json.dumps({"event": "tool_call", "session": "s1", "call_id": {}, "name": "t"}),
             json.dumps({"event": "tool_call", "session": "s1", "call_id": True, "name": "t"}),
             json.dumps({"event": "tool_call", "session": "s1", "call_id": "c", "name": 5})]
    box = fake_server([{"ok": True, "value": "'one'", "timed_out": False},
                       {"ok": True, "value": "'two'", "timed_out": False}], noise=noise)
    session = box.session(tools={"t": lambda: 1})
    assert session.execute("1", timeout=5).value == "'one'"
    assert session.execute("2", timeout=5).value == "'two'"


def test_the_async_client_checks_replies_too(tmp_path):
    program = tmp_path / "fake-sqbox"
    program.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    program.chmod(0o755)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"ok": True, "error": "boom", "timed_out": False}, {"ok": True, "data_b64": 5}]}))

    async def main():
        async with sqbox.AsyncSandbox(str(script), binary=str(program)) as box:
            session = await box.session()
            result = await session.execute("x", timeout=5)
            assert result.error.type == "ProtocolError"
            with pytest.raises(sqbox.ProtocolError):
                await session.get("/f")

    asyncio.run(main())


def test_malformed_output_events_are_dropped(fake_server):
    # The exec is request 3 (after the ping and the session_open); a forging session's code
    # could make the server pass these on for it.
    noise = [json.dumps(event) for event in (
        {"id": 3, "event": "output", "stream": "stdin", "data": "bad stream"},
        {"id": 3, "event": "output", "stream": "stdout", "data": 5},
        {"id": 3, "event": "output", "stream": "stdout", "data": ["x"]},
        {"id": 3, "event": "output", "stream": "stdout", "data_b64": "not base64!"},
        {"id": 3, "event": "output", "stream": "stdout", "data_b64": 5},
        {"id": True, "event": "output", "stream": "stdout", "data": "bad id"},
        {"id": 99, "event": "output", "stream": "stdout", "data": "nobody's"},
        {"id": 3, "event": "output", "stream": "stderr", "data": "fine"},
    )]
    box = fake_server([{"ok": True, "stdout": "o", "timed_out": False},
                       {"ok": True, "value": "'next'", "timed_out": False}], noise=noise)
    session = box.session()
    chunks = []
    result = session.execute("x", timeout=5, on_stdout=chunks.append,
                             on_stderr=lambda text: chunks.append(("err", text)))
    assert chunks == [("err", "fine")] and result.stdout == "o"
    assert session.execute("next", timeout=5).value == "'next'"

"""Streamed output (on_stdout/on_stderr) of Sandbox.run and Session.execute, on the real binary
and image: chunks arrive while the command runs, and a flood printed to a slow callback grows
neither the client's memory nor the server's (PROTOCOL.md, "Streaming output")."""
import asyncio
import threading
import time

import pytest

import sqbox

WAIT = 30  # seconds a payload waits for the test's sign before it gives up


def rss(pid="self"):
    """Resident memory of a process, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


# ---------------------------------------------------------------------------------------------
# Chunks arrive before the end


def test_run_chunks_arrive_while_the_command_runs(sandbox, tmp_path):
    # The command waits for a file that the callback makes when it has the first chunk: had the
    # chunk not come before the end, the command would give up and say so.
    go = tmp_path / "go"
    chunks = []

    def on_stdout(text):
        chunks.append(text)
        go.touch()

    result = sandbox.run(
        f"echo first; i=0; while [ ! -e /sign/go ] && [ $i -lt {WAIT * 20} ]; do sleep 0.05; "
        "i=$((i+1)); done; [ -e /sign/go ] && echo second || echo no chunk came",
        mounts=[(str(tmp_path), "/sign", "ro")], timeout=WAIT + 30, on_stdout=on_stdout)
    assert result.stdout == "first\nsecond\n"
    assert chunks[0] == "first\n" and "".join(chunks) == result.stdout


def test_session_chunks_arrive_while_the_code_runs(sandbox):
    # The code asks a host tool whether the client has seen its first line yet.
    seen = threading.Event()
    chunks = []

    def on_stdout(text):
        chunks.append(text)
        if "first" in text:
            seen.set()

    def first_seen():
        return seen.wait(WAIT)

    with sandbox.session(tools=[first_seen], timeout=WAIT + 30) as session:
        result = session.execute("print('first', flush=True)\nprint(tools.first_seen())",
                                 on_stdout=on_stdout)
    assert result.stdout == "first\nTrue\n", result
    assert "".join(chunks) == result.stdout


def test_both_streams_and_binary_output(sandbox):
    out, err = [], []
    result = sandbox.run("printf 'a\\303'; sleep 0.2; printf '\\251b\\377'; echo oops >&2",
                         on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == result.stdout == "a\u00e9b\ufffd"
    assert "".join(err) == result.stderr == "oops\n"
    assert result.stdout_bytes == b"a\xc3\xa9b\xff"


def test_streamed_output_stops_at_the_output_limit(sandbox, session):
    chunks = []
    result = sandbox.run("head -c 100000 /dev/zero | tr '\\0' x", output_limit=1000,
                         on_stdout=chunks.append)
    assert "".join(chunks) == result.stdout == "x" * 1000 and result.stdout_truncated
    chunks.clear()
    executed = session.execute("print('y' * 100000)", on_stdout=chunks.append)
    assert "".join(chunks) == executed.stdout and executed.stdout_truncated is False
    assert len(executed.stdout) == 100001


def test_a_streamed_exec_keeps_its_display_data(session):
    chunks = []
    result = session.execute("print('shown', flush=True)\nclass T:\n"
                             "    def _repr_html_(self):\n        return '<b>t</b>'\n"
                             "    def __repr__(self):\n        return 'T()'\n"
                             "display('x')\nT()", on_stdout=chunks.append)
    assert "".join(chunks) == result.stdout == "shown\n"
    assert result.value == "T()"
    assert [(item.text, item.html) for item in result.display] == [("'x'", None),
                                                                  ("T()", "<b>t</b>")]


def test_a_callbacks_exception_is_raised_once_the_command_has_ended(sandbox, session):
    calls = []

    def failing(text):
        calls.append(text)
        raise ValueError("callback failed")

    with pytest.raises(ValueError, match="callback failed"):
        sandbox.run("echo a; sleep 0.2; echo b", on_stdout=failing)
    assert calls == ["a\n"]  # not called again after it failed
    with pytest.raises(ValueError, match="callback failed"):
        session.execute("print('x')", on_stdout=failing)
    assert session.execute("1 + 1").value == "2"  # the session goes on


def test_a_callback_cannot_call_the_sandbox(sandbox, session):
    def reentrant(text):
        sandbox.run(["true"])

    with pytest.raises(sqbox.SqboxError, match="output callback cannot call the sandbox"):
        session.execute("print('x')", on_stdout=reentrant)
    assert sandbox.run(["echo", "ok"]).stdout == "ok\n"


def test_async_callbacks_may_be_coroutines(sqbox_bin, python_image):
    async def scenario():
        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin) as box:
            chunks = []

            async def on_stdout(text):
                await asyncio.sleep(0.01)
                chunks.append(text)

            result = await box.run(["sh", "-c", "echo one; sleep 0.2; echo two"],
                                   on_stdout=on_stdout)
            ran = (result.stdout, list(chunks))
            chunks.clear()
            async with await box.session() as session:
                executed = await session.execute(
                    "import time\nprint('one', flush=True)\ntime.sleep(0.2)\nprint('two')",
                    on_stdout=on_stdout, on_stderr=chunks.append)
            return ran, (executed.stdout, chunks)

    ran, executed = asyncio.run(scenario())
    assert ran == ("one\ntwo\n", ["one\n", "two\n"])
    assert executed == ("one\ntwo\n", ["one\n", "two\n"])


# ---------------------------------------------------------------------------------------------
# Back-pressure: a flood to a slow callback


class SlowReader:
    """A callback that is slow for `seconds` (sampling the client's and the server's memory
    meanwhile), then fast, so that the command ends soon after."""

    def __init__(self, server_pid, seconds=4.0, delay=0.05):
        self.server_pid, self.seconds, self.delay = server_pid, seconds, delay
        self.chunks, self.start = [], None
        self.client, self.server = [], []

    def __call__(self, text):
        self.chunks.append(text)
        now = time.monotonic()
        if self.start is None:
            self.start = now
        if now - self.start < self.seconds:
            self.client.append(rss())
            self.server.append(rss(self.server_pid))
            time.sleep(self.delay)

    def growth(self):
        """How much the client and the server grew while the callback was slow."""
        assert len(self.client) >= 20, "the callback was hardly called"
        return max(self.client) - self.client[0], max(self.server) - self.server[0]


LIMIT = 32 << 20  # what either side may grow by while it is slow


def test_a_flooding_run_grows_neither_side(sqbox_bin, python_image):
    # Without back-pressure the server reads `yes` at its pace (GB/s) and holds up to the
    # output limit (128 MiB) and its events (170 MiB more) for the slow client.
    with sqbox.Sandbox(python_image, binary=sqbox_bin) as box:
        slow = SlowReader(box.pid)
        result = box.run(["yes", "0123456789" * 10], timeout=8, output_limit=128 << 20,
                         on_stdout=slow)
    client, server = slow.growth()
    assert client < LIMIT and server < LIMIT, (client, server)
    assert result.timed_out
    assert "".join(slow.chunks) == result.stdout


def test_a_flooding_exec_grows_neither_side(sqbox_bin, python_image):
    # The session's code writes into its capture file (the sandbox's tmpfs, here 256 MiB);
    # without back-pressure the server would hold the driver's events for the slow client.
    with sqbox.Sandbox(python_image, binary=sqbox_bin,
                       extra_args=["--tmpfs-size", "256M"]) as box:
        slow = SlowReader(box.pid)
        with box.session(output_limit=48 << 20) as session:
            result = session.execute("import sys\nline = '0123456789' * 10 + '\\n'\n"
                                     "while True:\n    sys.stdout.write(line)",
                                     timeout=6, on_stdout=slow)
    client, server = slow.growth()
    assert client < LIMIT and server < LIMIT, (client, server)
    assert result.error is not None  # the interrupt, or the full tmpfs
    assert "".join(slow.chunks) == result.stdout and len(result.stdout) == 48 << 20


def test_an_interrupted_exec_streams_its_rest_to_a_slow_client(sandbox):
    # The code writes 8 MiB, then hangs past its timeout; the client takes the output slowly
    # (~6 s): the interrupted code's answer waits behind it, and the session is not killed for
    # the wait (the server gives a driver 2 s to answer an interrupt).
    chunks = []

    def slow(text):
        chunks.append(text)
        time.sleep(0.05)

    with sandbox.session(output_limit=16 << 20) as session:
        result = session.execute("import sys, time\nline = 'x' * 1023 + '\\n'\n"
                                 "for _ in range(8192):\n    sys.stdout.write(line)\n"
                                 "sys.stdout.flush()\ntime.sleep(1000)",
                                 timeout=1, on_stdout=slow)
        assert result.timed_out and result.error.type == "KeyboardInterrupt", result.error
        assert "".join(chunks) == result.stdout and len(result.stdout) == 8 << 20
        assert session.execute("'alive'").value == "'alive'"

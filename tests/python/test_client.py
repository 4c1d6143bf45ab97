"""The Python client against the real sqbox binary and the real Python image."""
import ast
import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import host_mounts
import host_processes
import sqbox

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# sqbox.run: one-shot `sqbox run`


def test_run_prints_and_exits_zero(sqbox_bin, python_image):
    result = sqbox.run(python_image, ["python3", "-c", "print('hello')"], binary=sqbox_bin)
    assert result.exit_code == 0 and result.ok
    assert result.stdout == "hello\n" and result.stdout_bytes == b"hello\n"
    assert result.stderr == ""
    assert result.signal is None and not result.timed_out and not result.oom_killed
    assert result.wall_ms > 0


def test_run_string_runs_through_sh_and_reports_exit_code(sqbox_bin, python_image):
    result = sqbox.run(python_image, "echo out; echo err >&2; exit 7", binary=sqbox_bin)
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.ok


def test_run_reports_a_signal(sqbox_bin, python_image):
    result = sqbox.run(python_image, "kill -SEGV $$", binary=sqbox_bin)
    assert result.exit_code == 128 + signal.SIGSEGV
    assert result.signal == signal.SIGSEGV


def test_run_timeout(sqbox_bin, python_image):
    started = time.monotonic()
    result = sqbox.run(python_image, ["sleep", "30"], timeout=0.5, binary=sqbox_bin)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 10


def test_run_stdin_bytes_round_trip(sqbox_bin, python_image):
    data = bytes(range(256)) * 64  # not valid UTF-8
    result = sqbox.run(python_image, ["cat"], stdin=data, binary=sqbox_bin)
    assert result.stdout_bytes == data
    assert "\ufffd" in result.stdout  # the str view replaces invalid bytes


def test_run_stdin_text_and_default_empty(sqbox_bin, python_image):
    upper = "import sys; print(sys.stdin.read().upper())"
    assert sqbox.run(python_image, ["python3", "-c", upper], stdin="abc",
                     binary=sqbox_bin).stdout == "ABC\n"
    # Without stdin the payload reads EOF at once instead of waiting for our terminal.
    assert sqbox.run(python_image, ["python3", "-c", upper], timeout=10,
                     binary=sqbox_bin).stdout == "\n"


def test_run_mounts_env_and_output_limit(sqbox_bin, python_image, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    (source / "data.txt").write_text("from the host")
    out = tmp_path / "out"
    out.mkdir()
    result = sqbox.run(
        python_image,
        "cat /in/data.txt; echo; echo $GREETING; echo written > /out/file; "
        "touch /in/new 2>/dev/null && echo in-is-writable || echo in-is-read-only",
        mounts=[(str(source), "/in", "ro"), {"source": str(out), "target": "/out"}],
        env={"GREETING": "hi there"}, binary=sqbox_bin)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "from the host\nhi there\nin-is-read-only\n"
    assert (out / "file").read_text() == "written\n"

    limited = sqbox.run(python_image, ["python3", "-c", "print('x' * 100000)"],
                        output_limit=1000, binary=sqbox_bin)
    assert limited.stdout_truncated and not limited.stderr_truncated
    assert limited.stdout == "x" * 1000


def test_run_bad_image_raises_sqbox_error(sqbox_bin, tmp_path):
    with pytest.raises(sqbox.SqboxError) as caught:
        sqbox.run(tmp_path / "missing.sqsh", ["true"], binary=sqbox_bin)
    assert "missing.sqsh" in str(caught.value)
    assert "missing.sqsh" in caught.value.stderr


def test_run_failing_payload_is_not_an_error(sqbox_bin, python_image):
    # 127 (command not found) is the payload's problem: a result, not an exception.
    result = sqbox.run(python_image, ["no-such-command"], binary=sqbox_bin)
    assert result.exit_code == 127


def test_run_refuses_network(sqbox_bin, python_image):
    with pytest.raises(ValueError, match="network"):
        sqbox.run(python_image, ["true"], network=True, binary=sqbox_bin)


def test_binary_lookup(sqbox_bin, tmp_path, monkeypatch):
    assert sqbox.find_binary(sqbox_bin) == sqbox_bin
    monkeypatch.setenv("SQBOX_BIN", sqbox_bin)
    assert sqbox.find_binary() == sqbox_bin
    monkeypatch.delenv("SQBOX_BIN")
    (tmp_path / "sqbox").symlink_to(sqbox_bin)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sqbox.find_binary() == str(tmp_path / "sqbox")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(sqbox.SqboxError, match="SQBOX_BIN"):
        sqbox.find_binary()
    with pytest.raises(sqbox.SqboxError, match="not an executable"):
        sqbox.find_binary(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# Sandbox.run


def test_sandbox_run(sandbox):
    result = sandbox.run(["python3", "-c", "import sys; print(sys.stdin.read()[::-1]); "
                          "print('e', file=sys.stderr); sys.exit(3)"], stdin="abc")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "cba\n", "e\n")
    assert not result.timed_out and result.wall_ms > 0


def test_sandbox_run_binary_output_env_and_mounts(sandbox, tmp_path):
    (tmp_path / "f").write_bytes(b"\xff\x00data")
    result = sandbox.run("cat /m/f; printf %s \"$K\"", env={"K": "v"},
                         mounts=[(str(tmp_path), "/m", "ro")])
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == b"\xff\x00datav"


def test_sandbox_run_timeout(sandbox):
    started = time.monotonic()
    result = sandbox.run(["sleep", "30"], timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 10


def test_max_parallel_and_pool_reach_the_server(sqbox_bin, python_image):
    with sqbox.Sandbox(python_image, binary=sqbox_bin, max_parallel=1, pool=1) as box:
        assert {"--max-parallel", "--pool"} <= set(host_processes.cmdline(box.pid).split())
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda i: box.run(["sleep", "0.3"]), range(4)))
        assert all(r.exit_code == 0 for r in results)
        assert time.monotonic() - started >= 1.2  # one sandbox at a time


def test_sandbox_run_bad_mount_raises(sandbox, tmp_path):
    with pytest.raises(sqbox.SqboxError, match="does-not-exist"):
        sandbox.run(["true"], mounts=[(str(tmp_path / "does-not-exist"), "/m")])
    # Refused while the sandbox is set up (status 125), not when the request is read.
    with pytest.raises(sqbox.SqboxError, match="symlink") as caught:
        sandbox.run(["true"], mounts=[(str(tmp_path), "/bin/x")])
    assert "symlink" in caught.value.stderr
    assert sandbox.run(["true"]).exit_code == 0  # the server is still fine


def test_sandbox_with_bad_image_raises_and_leaves_nothing(sqbox_bin, tmp_path):
    before = set(host_processes.children(os.getpid()))
    with pytest.raises(sqbox.SqboxError) as caught:
        sqbox.Sandbox(tmp_path / "missing.sqsh", binary=sqbox_bin)
    assert "missing.sqsh" in str(caught.value)
    assert set(host_processes.children(os.getpid())) <= before


def _send_only_after_the_server_exited(monkeypatch, cls, is_async):
    """Delay each send until the server is gone: the interleaving CI once hit by chance."""
    original = cls._send

    def late_send(self, line):
        self._proc.wait()
        return original(self, line)

    async def late_send_async(self, line):
        await self._proc.wait()
        return await original(self, line)

    monkeypatch.setattr(cls, "_send", late_send_async if is_async else late_send)


def test_sandbox_whose_server_exits_before_the_first_request_says_why(
        sqbox_bin, tmp_path, monkeypatch):
    _send_only_after_the_server_exited(monkeypatch, sqbox.Sandbox, is_async=False)
    with pytest.raises(sqbox.SqboxError) as caught:
        sqbox.Sandbox(tmp_path / "missing.sqsh", binary=sqbox_bin)
    assert "failed to start (exit status" in str(caught.value)
    assert "missing.sqsh" in str(caught.value) and "missing.sqsh" in caught.value.stderr


def test_async_sandbox_whose_server_exits_before_the_first_request_says_why(
        sqbox_bin, tmp_path, monkeypatch):
    _send_only_after_the_server_exited(monkeypatch, sqbox.AsyncSandbox, is_async=True)

    async def scenario():
        async with sqbox.AsyncSandbox(tmp_path / "missing.sqsh", binary=sqbox_bin):
            pass

    with pytest.raises(sqbox.SqboxError) as caught:
        asyncio.run(scenario())
    assert "failed to start (exit status" in str(caught.value)
    assert "missing.sqsh" in str(caught.value) and "missing.sqsh" in caught.value.stderr


# ---------------------------------------------------------------------------------------------
# Sessions


def test_state_persists_and_trailing_expression_value(session):
    first = session.execute("x = 41\nprint('set')")
    assert first.stdout == "set\n" and first.value is None and first.error is None
    second = session.execute("x + 1")
    assert second.value == "42"
    assert session.execute("'a' * 3").value == "'aaa'"  # a repr
    assert session.execute("import os\nos.system('echo from a child')").stdout \
        == "from a child\n"


def test_exception_reports_type_message_and_traceback(session):
    result = session.execute("def f():\n    return 1 / 0\nf()")
    assert result.error is not None and not result.ok
    assert result.error.type == "ZeroDivisionError"
    assert result.error.message == "division by zero"
    assert "Traceback" in result.error.traceback and "in f" in result.error.traceback
    with pytest.raises(sqbox.SandboxExecError) as caught:
        result.raise_for_error()
    assert caught.value.type == "ZeroDivisionError"
    assert session.execute("2 + 2").raise_for_error().value == "4"  # still usable


@pytest.mark.parametrize("crash", [
    "import os\nos._exit(3)",
    "import ctypes\nctypes.string_at(0)",  # segfault
])
def test_crash_kills_only_its_session(sandbox, crash):
    with sandbox.session() as doomed, sandbox.session() as other:
        other.execute("y = 'intact'")
        with pytest.raises(sqbox.SessionDead):
            doomed.execute(crash)
        with pytest.raises(sqbox.SessionDead):
            doomed.execute("1")  # stays dead until reset
        assert other.execute("y").value == "'intact'"
        doomed.reset()
        assert doomed.execute("1 + 1").value == "2"


def test_timeout_interrupts_and_session_survives(session):
    session.execute("kept = 'yes'")
    started = time.monotonic()
    result = session.execute("while True: pass", timeout=1)
    assert result.timed_out
    assert result.error is not None and result.error.type == "KeyboardInterrupt"
    assert time.monotonic() - started < 10
    assert session.execute("kept").value == "'yes'"


def test_timeout_ignored_by_code_kills_the_session(session):
    stubborn = textwrap.dedent("""\
        while True:
            try:
                while True:
                    pass
            except KeyboardInterrupt:
                pass
        """)
    started = time.monotonic()
    with pytest.raises(sqbox.SessionDead):
        session.execute(stubborn, timeout=0.5)
    assert time.monotonic() - started < 10
    session.reset()
    assert session.execute("'back'").value == "'back'"


def test_tools_round_trip(sandbox):
    calls = []

    def add(a, b, *, scale=1):
        calls.append(threading.current_thread().name)
        return {"sum": (a + b) * scale, "items": [a, b]}

    def fail(message):
        raise ValueError(message)

    def not_json():
        return object()

    with sandbox.session(tools=[add, fail]) as sess:
        sess.register_tool(not_json)
        sess.register_tool(lambda: "renamed", name="other")
        result = sess.execute("r = tools.add(2, 3, scale=10)\nr").raise_for_error()
        assert ast.literal_eval(result.value) == {"sum": 50, "items": [2, 3]}
        # A host exception arrives as sqbox_tools.ToolError carrying type and message.
        caught = sess.execute(textwrap.dedent("""\
            from sqbox_tools import ToolError
            try:
                tools.fail("bad query")
            except ToolError as e:
                out = str(e)
            out
            """)).raise_for_error()
        assert "ValueError" in caught.value and "bad query" in caught.value
        # Uncaught, it is the exec's error.
        uncaught = sess.execute("tools.fail('boom')")
        assert uncaught.error.type == "ToolError" and "boom" in uncaught.error.message
        unserialisable = sess.execute("tools.not_json()")
        assert unserialisable.error.type == "ToolError"
        assert "JSON" in unserialisable.error.message
        assert sess.execute("tools.other()").value == "'renamed'"
    assert calls and all(name != "sqbox-reader" for name in calls)


def test_tool_can_use_the_sandbox_while_called(sandbox):
    # The tool runs off the reader thread, so it can make requests of its own.
    def shell(command):
        return sandbox.run(command).stdout

    with sandbox.session(tools=[shell]) as sess:
        assert sess.execute("tools.shell('echo nested')").value == "'nested\\n'"


def test_put_get_binary_round_trip(session):
    data = os.urandom(300_000) + bytes(range(256))
    session.put("/tmp/blob.bin", data)
    digest = session.execute("import hashlib\n"
                             "hashlib.sha256(open('/tmp/blob.bin','rb').read()).hexdigest()")
    assert digest.value == repr(hashlib.sha256(data).hexdigest())
    session.execute("open('/tmp/made.bin', 'wb').write(bytes(range(256))[::-1])")
    assert session.get("/tmp/made.bin") == bytes(range(256))[::-1]
    assert session.get("/tmp/blob.bin") == data
    with pytest.raises(sqbox.SqboxError):
        session.get("/tmp/does-not-exist")


def test_reset_gives_a_clean_namespace_and_keeps_tools(sandbox):
    with sandbox.session(tools={"ping": lambda: "pong"}) as sess:
        sess.execute("x = 1\nopen('/tmp/f', 'w').write('x')")
        sess.reset()
        result = sess.execute("x")
        assert result.error is not None and result.error.type == "NameError"
        assert sess.execute("import os\nos.path.exists('/tmp/f')").value == "False"
        assert sess.execute("tools.ping()").value == "'pong'"


def test_session_options(sandbox, tmp_path):
    (tmp_path / "f").write_text("mounted")
    with sandbox.session(env={"GREETING": "hello"}, mounts=[(str(tmp_path), "/m", "ro")],
                         output_limit=100, memory="1G") as sess:
        assert sess.execute("import os\nos.environ['GREETING']").value == "'hello'"
        assert sess.execute("open('/m/f').read()").value == "'mounted'"
        long = sess.execute("print('x' * 1000)")
        assert long.stdout_truncated and long.stdout == "x" * 100


def test_sandbox_defaults_apply_and_can_be_overridden(sqbox_bin, python_image):
    with sqbox.Sandbox(python_image, binary=sqbox_bin, timeout=0.5, env={"A": "1"}) as box:
        assert box.run(["sleep", "30"]).timed_out
        assert not box.run(["sleep", "1"], timeout=10).timed_out
        assert box.run("echo $A$B", env={"B": "2"}).stdout == "12\n"
        with box.session() as sess:
            assert sess.execute("while True: pass").timed_out


# Code that says (through a tool) that it runs, then sleeps: the test acts only once it runs.
SLEEP_ONCE_RUNNING = "tools.running()\nimport time\ntime.sleep(30)"


def _start_sleeping_execute(sess, running):
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(
        _capture(sess.execute, SLEEP_ONCE_RUNNING)))
    worker.start()
    assert running.wait(30), "the execute never started"
    return worker, outcome


def test_reset_fails_a_running_execute_then_works(sandbox):
    running = threading.Event()
    with sandbox.session(tools={"running": running.set}) as sess:
        worker, outcome = _start_sleeping_execute(sess, running)
        sess.reset()
        worker.join(timeout=5)
        assert not worker.is_alive(), "execute still waiting after a reset"
        assert isinstance(outcome[0], sqbox.SqboxError)
        assert sess.execute("1 + 1").value == "2"


def test_closing_a_session_fails_its_running_execute(sandbox):
    running = threading.Event()
    sess = sandbox.session(tools={"running": running.set})
    worker, outcome = _start_sleeping_execute(sess, running)
    sess.close()
    worker.join(timeout=5)
    assert not worker.is_alive(), "execute still waiting after its session was closed"
    assert isinstance(outcome[0], sqbox.SqboxError)


def test_closed_session_refuses_work(sandbox):
    sess = sandbox.session()
    sess.close()
    sess.close()  # twice is fine
    with pytest.raises(sqbox.SqboxError):
        sess.execute("1")


# ---------------------------------------------------------------------------------------------
# Concurrency


def test_200_concurrent_runs_from_threads(sandbox):
    def one(i):
        return i, sandbox.run(["sh", "-c", "echo $0", str(i)], timeout=60)

    with ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(one, range(200)))
    assert [(r.exit_code, r.stdout) for _, r in results] == [(0, f"{i}\n") for i in range(200)]


def test_200_concurrent_execs_and_tool_calls_from_threads(sandbox):
    sessions = [sandbox.session(tools={"double": lambda v: 2 * v}) for _ in range(4)]
    try:
        def one(i):
            return sessions[i % 4].execute(f"print({i})\ntools.double({i})", timeout=60)

        with ThreadPoolExecutor(max_workers=200) as pool:
            results = list(pool.map(one, range(200)))
        for i, result in enumerate(results):
            assert (result.stdout, result.value, result.error) == (f"{i}\n", str(2 * i), None)
    finally:
        for sess in sessions:
            sess.close()


# ---------------------------------------------------------------------------------------------
# asyncio


def test_async_sandbox(sqbox_bin, python_image):
    async def scenario():
        async def triple(v):
            await asyncio.sleep(0)
            return 3 * v

        async def refuse(reason):
            raise PermissionError(reason)

        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin) as box:
            result = await box.run(["python3", "-c", "print(6 * 7)"])
            assert (result.exit_code, result.stdout) == (0, "42\n")
            async with await box.session(tools=[triple, refuse]) as sess:
                await sess.register_tool(lambda a, b=0: a - b, name="sub")
                assert (await sess.execute("x = tools.triple(5)\nx")).value == "15"
                assert (await sess.execute("tools.sub(9, b=2)")).value == "7"
                refused = (await sess.execute("tools.refuse('no')")).error
                assert (refused.type, refused.message) == ("ToolError", "PermissionError: no")
                assert (await sess.execute("x")).value == "15"
                error = (await sess.execute("raise KeyError('k')")).error
                assert error.type == "KeyError"
                await sess.put("/tmp/a", b"\x00\x01\xff")
                assert await sess.get("/tmp/a") == b"\x00\x01\xff"
                slow = await sess.execute("while True: pass", timeout=1)
                assert slow.timed_out
                await sess.reset()
                assert (await sess.execute("'x' in globals()")).value == "False"
            with pytest.raises(sqbox.SessionDead):
                async with await box.session() as dead:
                    await dead.execute("import os; os._exit(1)")
            busy = await box.session()
            running = asyncio.ensure_future(busy.execute("while True: pass"))
            await asyncio.sleep(0.3)
            processes = host_processes.descendants(box.pid)
        # aclose() with an exec in progress: the call fails and nothing is left running.
        with pytest.raises(sqbox.SqboxError):
            await running
        return processes

    processes = asyncio.run(scenario())
    assert len(processes) >= 4, {p: host_processes.cmdline(p) for p in processes}
    assert host_processes.wait_until_ended(processes, seconds=5) == []


def test_async_200_concurrent(sqbox_bin, python_image):
    async def scenario():
        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin) as box:
            sessions = [await box.session(tools={"double": lambda v: 2 * v}) for _ in range(4)]

            async def run(i):
                return (await box.run(["sh", "-c", "echo $0", str(i)], timeout=60)).stdout

            async def execute(i):
                result = await sessions[i % 4].execute(f"print({i})\ntools.double({i})")
                return result.stdout + str(result.value)

            runs = await asyncio.gather(*(run(i) for i in range(200)))
            execs = await asyncio.gather(*(execute(i) for i in range(200)))
            return runs, execs

    runs, execs = asyncio.run(scenario())
    assert runs == [f"{i}\n" for i in range(200)]
    assert execs == [f"{i}\n{2 * i}" for i in range(200)]


# ---------------------------------------------------------------------------------------------
# Lifetime: nothing outlives the client


def test_close_leaves_no_process(sqbox_bin, python_image):
    before_mounts, before_fuse = host_mounts.mountinfo(), host_mounts.fuse_connections()
    box = sqbox.Sandbox(python_image, binary=sqbox_bin)
    sess = box.session()
    sess.execute("import subprocess\nsubprocess.Popen(['sleep', '1000'])")
    in_flight = []
    runner = threading.Thread(target=lambda: in_flight.append(_capture(box.run, ["sleep", "1000"])))
    runner.start()
    # The session's sleep and the run's: both sandboxes are up.
    processes = host_processes.wait_for_descendants(box.pid, "sleep 1000", count=2)
    # server, the session's and the run's sandbox processes (supervisor, FUSE server, init, ...)
    assert len(processes) >= 5, {p: host_processes.cmdline(p) for p in processes}
    box.close()
    runner.join(timeout=10)
    assert isinstance(in_flight[0], sqbox.SqboxError)  # the pending call was failed, not hung
    assert host_processes.wait_until_ended(processes, seconds=5) == []
    assert host_mounts.mountinfo() == before_mounts
    assert host_mounts.new_fuse_connections(before_fuse) == []
    with pytest.raises(sqbox.SqboxError):
        sess.execute("1")
    with pytest.raises(sqbox.SqboxError):
        box.run(["true"])


def _capture(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # returned, to be checked by the test's thread
        return exc


def test_server_death_fails_calls_promptly(sqbox_bin, python_image):
    with sqbox.Sandbox(python_image, binary=sqbox_bin) as box:
        processes = host_processes.descendants(box.pid)
        sess = box.session()
        processes.update(host_processes.descendants(box.pid))
        os.kill(box.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(sqbox.SqboxError, match="exited"):
            sess.execute("import time; time.sleep(100)")
        assert time.monotonic() - started < 10
        with pytest.raises(sqbox.SqboxError):
            box.run(["true"])
        # Its sandboxes die with it.
        assert host_processes.wait_until_ended(processes, seconds=5) == []


def test_sandbox_made_in_a_finished_thread_keeps_working(sqbox_bin, python_image):
    # Made in a worker thread that then ends: the server must outlive that thread.
    made = []
    maker = threading.Thread(target=lambda: made.append(
        sqbox.Sandbox(python_image, binary=sqbox_bin)))
    maker.start()
    maker.join()
    with made[0] as box:
        time.sleep(0.5)
        assert box.run(["echo", "alive"]).stdout == "alive\n"


CLIENT_SCRIPT = """
import json, sys, threading, time
sys.path.insert(0, {python_dir!r})
import sqbox
box = sqbox.Sandbox({image!r}, binary={binary!r})
sess = box.session()
sess.execute("import subprocess; subprocess.Popen(['sleep', '1000'])")
busy_running = threading.Event()
busy = box.session(tools={{"running": busy_running.set}})
# Killed mid-request: a run and an exec (neither with a timeout) are in progress.
threading.Thread(target=box.run, args=(["sleep", "1000"],), daemon=True).start()
threading.Thread(target=busy.execute, args=("tools.running()\\nwhile True: pass",),
                 daemon=True).start()
assert busy_running.wait(60)
print(json.dumps({{"server": box.pid}}), flush=True)
time.sleep(1000)
"""


def test_kill_9_of_the_client_leaves_nothing(sqbox_bin, python_image):
    before_mounts, before_fuse = host_mounts.mountinfo(), host_mounts.fuse_connections()
    script = CLIENT_SCRIPT.format(python_dir=str(ROOT / "python"), image=python_image,
                                  binary=sqbox_bin)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = client.stdout.readline()
        assert line, "client script failed"
        server = json.loads(line)["server"]
        # The session's sleep and the run's: both sandboxes are up.
        processes = host_processes.wait_for_descendants(client.pid, "sleep 1000", count=2)
        assert server in processes
        assert len(processes) >= 8, {p: host_processes.cmdline(p) for p in processes}
        client.kill()
        client.wait()
        gone_by = time.monotonic()
        leftovers = host_processes.wait_until_ended(processes, seconds=5)
        assert leftovers == [], {p: host_processes.cmdline(p) for p in leftovers}
        assert time.monotonic() - gone_by < 5
        assert host_mounts.mountinfo() == before_mounts
        assert host_mounts.new_fuse_connections(before_fuse) == []
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout.close()


# ---------------------------------------------------------------------------------------------
# Packaging and examples


def test_pip_install_into_a_venv(tmp_path, sqbox_bin, python_image):
    venv = tmp_path / "venv"
    # The system's pip, setuptools and wheel (Debian packages) serve the venv, and the build
    # is offline: the test must not depend on PyPI.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    # From a copy: setuptools builds in the source tree (build/, *.egg-info).
    source = tmp_path / "src"
    shutil.copytree(ROOT / "python", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-build-isolation", str(source)], check=True)
    check = ("import sqbox, sqbox.integrations.smolagents, sqbox.integrations.monarch, sys; "
             "print(sqbox.__file__); "
             "print(sqbox.run(sys.argv[1], 'echo installed').stdout, end='')")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", check, python_image],
                         cwd=tmp_path, env=dict(os.environ, SQBOX_BIN=sqbox_bin),
                         check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    assert out[0].startswith(str(venv)) and out[1] == "installed"


def _run_example(name, sqbox_bin, python_image):
    env = dict(os.environ, SQBOX_BIN=sqbox_bin, SQBOX_PYTHON_IMAGE=python_image,
               PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, str(ROOT / "python" / "examples" / name)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_example_sandboxed_python_coder(sqbox_bin, python_image):
    done = _run_example("sandboxed_python_coder.py", sqbox_bin, python_image)
    assert done.returncode == 0, done.stderr
    assert "stdout: '42\\n'" in done.stdout
    assert "ZeroDivisionError" in done.stdout
    assert "after recreate: NameError" in done.stdout


def test_example_smolagents_executor(sqbox_bin, python_image):
    done = _run_example("smolagents_executor.py", sqbox_bin, python_image)
    assert done.returncode == 0, done.stderr
    assert "final answer: 30 (is_final_answer=True)" in done.stdout
    assert "Sunny in Paris" in done.stdout


def test_forged_tool_calls_from_one_session_do_not_break_the_client(sandbox):
    """A session's code can write the driver's protocol itself. Malformed tool calls it forges
    must not stop the client's reader: the other sessions and runs keep working."""
    def lookup(key):
        return key.upper()

    with sandbox.session(tools=[lookup]) as victim, sandbox.session(tools=[lookup]) as attacker:
        victim.execute("kept = 1")
        forging = """
import json, os
for fd in range(3, 64):
    try:
        if 'pipe' not in os.readlink(f'/proc/self/fd/{fd}'):
            continue
        for forged in ({"event": "tool_call", "call_id": "f1", "name": "lookup", "args": 5},
                       {"event": "tool_call", "call_id": "f2", "name": "lookup", "kwargs": [1]}):
            os.write(fd, (json.dumps(forged) + "\\n").encode())
    except OSError:
        pass
"""
        try:
            attacker.execute(forging, timeout=10)
        except sqbox.SessionDead:
            pass  # overlapping forged calls break the protocol: the server ends that session
        assert victim.execute("kept + 1").value == "2"
        assert victim.execute("tools.lookup('x')").value == "'X'"
        assert sandbox.run(["true"]).exit_code == 0


def test_a_session_that_forges_its_own_reply_spoils_only_that_reply(sandbox):
    """The session's code reads the driver's token out of the driver's objects and answers its
    own execute with a malformed reply, then goes on running. The client makes that reply an
    error result (no AttributeError, no hang); the next execute gets its own answer; the other
    session never notices."""
    with sandbox.session() as attacker, sandbox.session() as bystander:
        bystander.execute("kept = 1")
        forging = """
import gc, json, os, time
driver = next(o for o in gc.get_objects() if type(o).__name__ == "Driver")
reply = {"event": "result", "seq": driver.seq, "token": driver.token, "ok": True,
         "error": "a string, not an object", "stdout": 5, "value": ["not", "a", "repr"]}
os.write(driver.proto_out, (json.dumps(reply) + "\\n").encode())
time.sleep(1)
'the real answer'
"""
        forged = attacker.execute(forging, timeout=20)
        assert forged.error is not None and forged.error.type == "ProtocolError", forged
        assert forged.value is None
        assert attacker.execute("6 * 7", timeout=20).value == "42"
        assert bystander.execute("kept + 1", timeout=20).value == "2"


def sandbox_inits(server_pid):
    """The server's sandboxes: processes below it that are pid 1 of a pid namespace of their own
    (set up ahead in the pool, or running a request)."""
    inits = []
    for pid in host_processes.descendants(server_pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # gone meanwhile
        nspid = next(line.split()[1:] for line in status.splitlines()
                     if line.startswith("NSpid:"))
        if len(nspid) >= 2 and nspid[-1] == "1":
            inits.append(pid)
    return inits


def wait_for_inits(server_pid, count, seconds=30.0):
    deadline = time.monotonic() + seconds
    while len(sandbox_inits(server_pid)) != count:
        assert time.monotonic() < deadline, (count, sandbox_inits(server_pid))
        time.sleep(0.05)


def wait_for_process_named(server_pid, name, count=1, seconds=30.0):
    """Until `count` processes below the server have `name` as their comm: a request's code runs."""
    def named():
        found = 0
        for pid in host_processes.descendants(server_pid):
            try:
                found += Path(f"/proc/{pid}/comm").read_text().strip() == name
            except OSError:
                pass  # gone meanwhile
        return found
    deadline = time.monotonic() + seconds
    while named() < count:
        assert time.monotonic() < deadline, f"no {count} {name} below the server"
        time.sleep(0.05)


# Code that names its process (PR_SET_NAME), so that the test sees it run, then sleeps.
RUNNING = "sqbox-test-run"
NAMED_SLEEP = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'%s', 0, 0, 0); time.sleep(%d)")


def test_a_pool_refills_once_no_run_is_under_way(sqbox_bin, python_image):
    """A request takes a sandbox from the pool; the pool fills up again once no run is under way,
    not while the request runs (its CPU would come out of the request's time). A take that
    empties the pool replaces what it took at once, so requests under load still find one."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin, pool=2) as box:
        wait_for_inits(box.pid, 2)
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(box.run, ["python3", "-c", NAMED_SLEEP % (RUNNING, 4)])
            wait_for_process_named(box.pid, RUNNING)
            time.sleep(1)
            # The running request's sandbox and the one left ready: no refill yet.
            assert len(sandbox_inits(box.pid)) == 2
            assert first.result().exit_code == 0
        wait_for_inits(box.pid, 2)  # refilled once it ended
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = [pool.submit(box.run, ["python3", "-c", NAMED_SLEEP % (RUNNING, 12)])
                    for _ in range(2)]
            wait_for_process_named(box.pid, RUNNING, count=2)
            # Both taken, the pool empty: the second take's replaced at once, beside the runs.
            wait_for_inits(box.pid, 3, seconds=8)
            time.sleep(1)
            assert len(sandbox_inits(box.pid)) == 3  # and only that one
            assert all(run.result().exit_code == 0 for run in runs)
        wait_for_inits(box.pid, 2)


def test_pre_started_interpreters_refill_once_no_run_is_under_way(sqbox_bin, python_image):
    """The same for --prestart's interpreters: run_python that leaves one waiting has its own
    replaced after it ends."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin, prestart=2) as box:
        wait_for_inits(box.pid, 2)
        with ThreadPoolExecutor(max_workers=1) as pool:
            run = pool.submit(box.run_python, NAMED_SLEEP % (RUNNING, 4))
            wait_for_process_named(box.pid, RUNNING)
            time.sleep(1)
            assert len(sandbox_inits(box.pid)) == 2
            result = run.result()
            assert result.exit_code == 0 and result.prestarted
        wait_for_inits(box.pid, 2)


@pytest.mark.skipif(os.geteuid() == 0, reason="--zygote is refused as root (tests/python/"
                    "test_prestart.py says why); run as an unprivileged user")
def test_the_zygote_makes_the_next_sandbox_once_no_request_runs(sqbox_bin, python_image):
    """The zygote keeps one sandbox made ahead. A request alone has the next made after it ends;
    requests beside each other have it made at once. Counted: the zygote's own sandbox's init,
    and each sandbox's pid 1."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin, zygote=True) as box:
        wait_for_inits(box.pid, 2)  # the zygote's sandbox, one made ahead
        with ThreadPoolExecutor(max_workers=2) as pool:
            run = pool.submit(box.run_python, NAMED_SLEEP % (RUNNING, 4))
            wait_for_process_named(box.pid, RUNNING)
            time.sleep(1)
            assert len(sandbox_inits(box.pid)) == 2  # the request's: none made beside it
            result = run.result()
            assert result.exit_code == 0 and result.prestarted
        wait_for_inits(box.pid, 2)
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = [pool.submit(box.run_python, NAMED_SLEEP % (RUNNING, 12)) for _ in range(2)]
            wait_for_process_named(box.pid, RUNNING, count=2)
            wait_for_inits(box.pid, 4, seconds=8)  # two requests and one made ahead
            assert all(r.result().exit_code == 0 for r in runs)
        wait_for_inits(box.pid, 2)

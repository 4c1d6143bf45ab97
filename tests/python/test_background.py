"""Background processes of a session (Session.spawn), on the real binary and image: a server
started beside the interpreter that the session's code talks to over loopback, its output read
later, waited for and killed; and nothing of them left once the session is closed."""
import asyncio

import pytest

import sqbox
import host_processes

SERVER = ("import http.server, sys\n"
          "class Handler(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        body = ('hello from ' + self.path).encode()\n"
          "        self.send_response(200)\n"
          "        self.end_headers()\n"
          "        self.wfile.write(body)\n"
          "        print('served', self.path, flush=True)\n"
          "http.server.HTTPServer(('127.0.0.1', 8123), Handler).serve_forever()\n")

FETCH = ("import time, urllib.request\n"
         "for attempt in range(600):\n"
         "    try:\n"
         "        reply = urllib.request.urlopen('http://127.0.0.1:8123/{path}').read()\n"
         "        break\n"
         "    except OSError:\n"
         "        time.sleep(0.05)\n"
         "reply.decode()")


def test_a_background_server_the_session_talks_to_ends_with_the_session(sandbox):
    session = sandbox.session(timeout=60)
    try:
        namespace = session.execute("import os\nos.readlink('/proc/self/ns/pid')").value
        namespace = namespace.strip("'")
        server = session.spawn(["python3", "-c", SERVER])
        # A grandchild too, and a daemon that left its process group and parent: the session's
        # end must take them as well.
        sleeper = session.spawn("sleep 1000 & sleep 1000; :")
        daemon = session.spawn(["python3", "-c", "import os, time\n"
                                "if os.fork(): os._exit(0)\nos.setsid()\n"
                                "if os.fork(): os._exit(0)\ntime.sleep(1000)"])
        assert daemon.wait(timeout=30) == 0
        assert session.execute(FETCH.format(path="a")).value == "'hello from /a'"
        assert session.execute(FETCH.format(path="b")).value == "'hello from /b'"
        output = server.read()
        assert (output.stdout, output.running, output.exit_code) == \
            ("served /a\nserved /b\n", True, None)
        assert '"GET /a HTTP/1.1" 200' in output.stderr  # the server's log
        assert server.read().stdout == ""  # read once
        assert server.poll() is None and sleeper.poll() is None
        in_sandbox = host_processes.processes_in_pid_namespace(namespace)
        # the driver, the server, the shell and its two sleeps, the daemon (and the sandbox's init)
        assert len(in_sandbox) >= 6, [host_processes.cmdline(p) for p in in_sandbox]
    finally:
        session.close()
    assert host_processes.wait_until_pid_namespace_is_empty(namespace) == []


def test_wait_kill_and_exit_codes(session):
    quick = session.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert quick.wait(timeout=30) == 3
    output = quick.read()
    assert (output.stdout, output.stderr, output.running, output.exit_code, output.signal) == \
        ("out\n", "err\n", False, 3, None)
    slow = session.spawn(["sleep", "1000"])
    assert slow.wait(timeout=0.2) is None  # still running
    slow.kill()
    assert slow.wait(timeout=30) == 128 + 9
    assert slow.read().signal == 9
    polite = session.spawn("trap 'echo terminated; exit 7' TERM; while :; do sleep 0.05; done")
    session.execute("import time; time.sleep(0.3)")  # the trap is set
    polite.kill(15)
    assert polite.wait(timeout=30) == 7
    assert polite.read().stdout == "terminated\n"


def test_environment_working_directory_and_errors(session):
    proc = session.spawn("echo $GREETING from $(pwd)", env={"GREETING": "hello"}, cwd="/tmp")
    proc.wait(timeout=30)
    assert proc.read().stdout == "hello from /tmp\n"
    with pytest.raises(sqbox.SqboxError, match="FileNotFoundError"):
        session.spawn(["/no/such/program"])
    with pytest.raises(sqbox.SqboxError, match="NoSuchProcess"):
        sqbox.BackgroundProcess(session, "p999", 0).read()


def test_a_long_wait_lets_another_threads_kill_through(session):
    # wait() without a timeout waits in slices: a kill from another thread gets its turn.
    import threading
    proc = session.spawn(["sleep", "1000"])
    killer = threading.Timer(0.5, proc.kill)
    killer.start()
    try:
        assert proc.wait() == 128 + 9
    finally:
        killer.cancel()


def test_async_background_process(sqbox_bin, python_image):
    async def scenario():
        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin) as box:
            async with await box.session() as session:
                proc = await session.spawn(["sh", "-c", "echo started; sleep 1000"])
                assert await proc.poll() is None
                seen = ""
                for _ in range(600):
                    seen += (await proc.read()).stdout
                    if seen:
                        break
                    await asyncio.sleep(0.05)
                await proc.kill()
                code = await proc.wait(timeout=30)
                return seen, code, await proc.read()

    seen, code, output = asyncio.run(scenario())
    assert (seen, code) == ("started\n", 137)
    assert (output.stdout, output.running, output.signal) == ("", False, 9)

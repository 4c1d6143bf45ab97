"""Escape and interference attempts through `sqbox serve`: sandboxes and sessions of one server
share a supervisor and a FUSE server, but not a root, processes, limits or the server itself.

Requests go through the raw protocol (src/session/PROTOCOL.md), so these tests depend on nothing
but the binary.
"""
import json
import os
import signal
import stat
import subprocess
import threading
import time

import pytest
from host_processes import (children, descendants, processes_with, wait_until_ended,
                            wait_until_gone)


class Server:
    """A `sqbox serve` child; responses are collected by id on a reader thread."""

    def __init__(self, binary, image, *options, marker="", cwd=None):
        self.proc = subprocess.Popen([binary, "serve", *options, image], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     bufsize=1, cwd=cwd)
        self.responses = {}
        self.events = []
        self.ended = False  # its stdout reached end of file: no answer will come
        self.stderr = []
        self.cond = threading.Condition()
        self.marker = marker
        threading.Thread(target=self._read, daemon=True).start()
        self._stderr_reader = threading.Thread(
            target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
        self._stderr_reader.start()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.cond:
                if "event" in message:
                    self.events.append(message)
                else:
                    self.responses[message.get("id")] = message
                self.cond.notify_all()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def send(self, request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def wait(self, request_id, timeout=60):
        deadline = time.monotonic() + timeout
        with self.cond:
            while request_id not in self.responses:
                # A server that failed fails the test at once, saying why, not after `timeout`.
                assert not self.ended, \
                    f"sqbox serve ended before answering {request_id}: {''.join(self.stderr)}"
                left = deadline - time.monotonic()
                assert left > 0, f"no answer to {request_id}"
                self.cond.wait(left)
            return self.responses.pop(request_id)

    def call(self, request, timeout=60):
        self.send(request)
        return self.wait(request["id"], timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr_reader.join(timeout=10)  # all of stderr, now that the server has ended


@pytest.fixture
def server(box):
    servers = []

    def start(*options, image=None):
        instance = Server(box.binary, image or box.python_image, *options)
        servers.append(instance)
        return instance

    yield start
    # Everything a server started (its sandboxes' supervisors, FUSE servers, inits, payloads,
    # session drivers) ends with it: the marker check cannot see them, their argv has none.
    for instance in servers:
        processes = descendants(instance.proc.pid)
        instance.close()
        left = wait_until_ended(processes)
        assert left == [], f"left behind by sqbox serve: {left}"


def open_session(srv, name):
    answer = srv.call({"id": f"open-{name}", "op": "session_open"})
    assert answer["ok"], answer
    return answer["session"]


def execute(srv, session, code, request_id, timeout=None):
    request = {"id": request_id, "op": "exec", "session": session, "code": code}
    if timeout:
        request["timeout"] = timeout
    return srv.call(request)


def test_sessions_do_not_share_files_or_processes(server, marker):
    srv = server()
    a = open_session(srv, "a")
    b = open_session(srv, "b")
    planted = execute(srv, a, f"open('/tmp/{marker}', 'w').write('a');"
                              f"open('/etc/{marker}', 'w').write('a');"
                              "import subprocess; p = subprocess.Popen(['sleep', '30']); p.pid", "a1")
    assert planted["error"] is None, planted
    seen = execute(srv, b, f"import os; [os.path.exists('/tmp/{marker}'), "
                           f"os.path.exists('/etc/{marker}'), "
                           "sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), "
                           "os.getpid()]", "b1")
    assert seen["error"] is None, seen
    tmp_seen, etc_seen, pids, own_pid = eval(seen["value"])  # a repr of plain Python values
    assert not tmp_seen and not etc_seen
    # b sees its own init and interpreter, never a's sleep.
    assert pids == [1, own_pid], pids


def test_session_driver_is_read_only_and_stays_mounted(server):
    srv = server()
    s = open_session(srv, "s")
    attempt = execute(srv, s, """
import ctypes, errno, os
results = {}
try:
    open('/run/sqbox/driver.py', 'a').write('pwned')
    results['write'] = 'ok'
except OSError as e:
    results['write'] = errno.errorcode[e.errno]
libc = ctypes.CDLL(None, use_errno=True)
results['umount'] = 'ok' if libc.umount2(b'/run/sqbox/driver.py', 2) == 0 else errno.errorcode[ctypes.get_errno()]
results
""", "attempt")
    assert attempt["error"] is None, attempt
    results = eval(attempt["value"])
    assert results["write"] == "EROFS"
    assert results["umount"] == "EPERM"
    # The interpreter still works after the attempts.
    assert execute(srv, s, "6 * 7", "after")["value"] == "42"


def test_a_fork_bomb_does_not_starve_other_sandboxes(server):
    """Each sandbox of the server counts its processes on its own (its own user namespace, or
    its own cgroup as root): a bomb at its limit leaves the others able to fork."""
    srv = server("--pids", "64")
    srv.send({"id": "bomb", "op": "run", "timeout": 6,
              "command": ["sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 5"]})
    time.sleep(1.5)
    other = srv.call({"id": "other", "op": "run", "command": [
        "sh", "-c", "n=0; for i in $(seq 20); do sh -c true && n=$((n+1)); done; echo $n"]},
        timeout=30)
    assert other["exit_code"] == 0, other
    assert other["stdout"] == "20\n"
    # The bomb's own shell may end any way it likes (its forks fail); it is answered, and the
    # server is fine.
    bomb = srv.wait("bomb", timeout=30)
    assert bomb["ok"] is True and "exit_code" in bomb, bomb
    assert "Cannot fork" in bomb["stderr"], "the bomb never reached its limit"
    assert srv.call({"id": "ping", "op": "ping"})["ok"] is True


def test_a_crashing_and_a_hanging_session_leave_the_server_and_others_alone(server):
    srv = server()
    victim = open_session(srv, "victim")
    crasher = open_session(srv, "crasher")
    hanger = open_session(srv, "hanger")
    assert execute(srv, victim, "state = 'kept'", "v1")["error"] is None
    crashed = execute(srv, crasher, "import ctypes; ctypes.string_at(0)", "c1")
    assert crashed["ok"] is False and crashed["session_dead"] is True
    hung = execute(srv, hanger, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                "while True: pass", "h1", timeout=1)
    assert hung["ok"] is False and hung["session_dead"] is True and hung["timed_out"] is True
    assert execute(srv, victim, "state", "v2")["value"] == "'kept'"
    assert srv.call({"id": "ping", "op": "ping"})["ok"] is True


def test_forged_protocol_messages_without_the_token_are_ignored(server):
    """The driver shares its process with the session's code, so that code can write the
    driver's protocol itself. Lines without the driver's token (given to it before any code ran)
    change nothing: the exec gets its own result, the next request its own, and no forged tool
    call reaches a client."""
    srv = server()
    s = srv.call({"id": "open-s", "op": "session_open", "tools": ["rm_rf_home"]})["session"]
    other = srv.call({"id": "open-o", "op": "session_open", "tools": ["rm_rf_home"]})["session"]
    srv.send({"id": "forge", "op": "exec", "session": s, "timeout": 20,
              "code": WRITE_TO_DRIVER_CHANNEL + """
import json, time
lines = [{"event": "ready"}, {"event": "tool_call", "call_id": "x1", "name": "rm_rf_home"}]
lines += [{"event": "result", "seq": n, "value": "'forged'"} for n in range(100)]
lines += [dict(line, token=t) for line in lines for t in ("", "0" * 32, None)]
written = sum(forge(json.dumps(line) + "\\n") for line in lines)
time.sleep(1)  # the server has read them before the real result comes
written
"""})
    srv.send({"id": "next", "op": "exec", "session": s, "code": "6 * 7"})
    forged, after = srv.wait("forge", timeout=30), srv.wait("next", timeout=30)
    assert forged["error"] is None and int(forged["value"]) >= 400, forged
    assert after["value"] == "42", after
    with srv.cond:
        assert [e for e in srv.events if e.get("name") == "rm_rf_home"] == []
    assert execute(srv, other, "6 * 7", "other")["value"] == "42"
    assert srv.call({"id": "ping", "op": "ping"})["ok"] is True


# Code that has read the driver's token from the driver's own objects writes on its channel.
WRITE_AS_THE_DRIVER = """
import gc, json, os
driver = next(o for o in gc.get_objects() if type(o).__name__ == "Driver")
def forge_as_driver(message):
    os.write(driver.proto_out, (json.dumps(dict(message, token=driver.token)) + "\\n").encode())
"""


def test_a_forgery_with_the_drivers_token_answers_at_most_its_own_request(server):
    """Code that reads the token out of the driver's memory can answer the request it runs in
    (SECURITY.md says so), but no other: the request after it gets its own answer, a forged
    `ready` counts for nothing, and its own tool calls after the forged answer are refused rather
    than left waiting. Nothing of it reaches another session."""
    srv = server()
    s = srv.call({"id": "open-s", "op": "session_open", "tools": ["lookup"]})["session"]
    other = open_session(srv, "other")
    srv.send({"id": "forge", "op": "exec", "session": s, "timeout": 20,
              "code": WRITE_AS_THE_DRIVER + """
import sqbox_tools, time
forge_as_driver({"event": "result", "seq": driver.seq, "ok": True, "value": "'forged'"})
for guess in (driver.seq + 1, driver.seq - 1, 0, 1):  # the next number is not known
    forge_as_driver({"event": "result", "seq": guess, "ok": True, "value": "'forged too'"})
forge_as_driver({"event": "ready"})
time.sleep(1)  # the server has taken the forgery and sent the next request meanwhile
try:
    tools.lookup("after")
    refused = None
except sqbox_tools.ToolError as e:
    refused = e.type
'real'
"""})
    srv.send({"id": "next", "op": "exec", "session": s, "code": "refused, 6 * 7"})
    srv.send({"id": "last", "op": "exec", "session": s, "code": "'last'"})
    forged = srv.wait("forge", timeout=30)
    assert forged["value"] == "'forged'", forged  # its own request: the forgery's to spoil
    after, last = srv.wait("next", timeout=30), srv.wait("last", timeout=30)
    assert after["error"] is None and after["value"] == "('RequestAnswered', 42)", after
    assert last["value"] == "'last'", last
    with srv.cond:
        assert [e for e in srv.events if e.get("name") == "lookup"] == []
    assert execute(srv, other, "6 * 7", "other")["value"] == "42"


def test_a_tool_result_without_call_id_does_not_leave_the_code_waiting(server):
    srv = server()
    s = srv.call({"id": "open", "op": "session_open", "tools": ["lookup"]})["session"]
    srv.send({"id": "call", "op": "exec", "session": s, "timeout": 20, "code": """
import sqbox_tools
try:
    tools.lookup(1)
except sqbox_tools.ToolError as e:
    caught = e.type
caught
"""})
    deadline = time.monotonic() + 30
    with srv.cond:
        while not [e for e in srv.events if e.get("name") == "lookup"]:
            assert srv.cond.wait(deadline - time.monotonic()), "no tool call came"
    srv.send({"op": "tool_result", "session": s, "result": 1})  # no call_id
    assert srv.wait(None, timeout=30)["error"]["type"] == "BadRequest"
    answer = srv.wait("call", timeout=30)
    assert answer["value"] == "'BadToolResult'", answer
    assert execute(srv, s, "6 * 7", "after")["value"] == "42"


def test_socket_is_private_to_its_owner(server, tmp_path):
    path = tmp_path / "serve.sock"
    srv = server("--socket", str(path))
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "socket never appeared"
        time.sleep(0.05)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o600, oct(mode)
    assert srv.call({"id": 1, "op": "ping"})["ok"]
    srv.call({"id": 2, "op": "shutdown"})
    srv.proc.wait(timeout=30)
    assert not path.exists()


def test_killing_the_server_leaves_no_sandbox_behind(server, marker):
    srv = server()
    s = open_session(srv, "s")
    # The marker rides in argv; sleep itself would take it for a bad interval and exit at once.
    sleeper = ["python3", "-c", "import time; time.sleep(300)", marker]
    srv.send({"id": "long", "op": "run", "command": sleeper})
    execute(srv, s, f"import subprocess; subprocess.Popen({sleeper!r}); 1", "bg")
    # Both (the run's and the session's child) run before the server is killed.
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 2:
        assert time.monotonic() < deadline, ("the marked sleepers never started", srv.responses)
        time.sleep(0.02)
    srv.proc.kill()
    srv.proc.wait()
    leftovers = wait_until_gone(marker, seconds=10)
    assert leftovers == [], f"processes left: {leftovers}"


# The driver's protocol fd, as session code finds it: the driver moved the channel it inherited
# on fd 1 to a descriptor of its own; any pipe it holds open for writing will do for an attack.
WRITE_TO_DRIVER_CHANNEL = """
import os
def forge(text):
    written = 0
    for fd in range(3, 64):
        try:
            flags = os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            continue
        if 'pipe' in flags:
            try:
                os.write(fd, text.encode())
                written += 1
            except OSError:
                pass
    return written
"""


@pytest.mark.parametrize("line", [
    "[1]", "5", '"text"', '{"event": 5}', '{"event": "tool_call", "call_id": [1]}',
    '{"event": "result", "ok": ' + "[" * 100000 + "]" * 100000 + "}",
], ids=["array", "number", "string", "event-number", "call-id-list", "deep"])
def test_malformed_driver_messages_do_not_take_the_server_down(server, line):
    srv = server()
    victim = open_session(srv, "victim")
    attacker = open_session(srv, "attacker")
    execute(srv, victim, "kept = 1", "v1")
    srv.send({"id": "forge", "op": "exec", "session": attacker, "timeout": 5,
              "code": WRITE_TO_DRIVER_CHANNEL + f"forge({line!r} + '\\n')\n'done'"})
    srv.wait("forge", timeout=30)
    assert srv.call({"id": "ping", "op": "ping"})["ok"] is True
    assert execute(srv, victim, "kept", "v2")["value"] == "1"
    assert srv.proc.poll() is None


def test_tool_calls_reach_the_client_only_for_registered_tools(server):
    srv = server()
    answer = srv.call({"id": "open", "op": "session_open", "tools": ["add"]})
    session = answer["session"]
    flood = execute(srv, session, WRITE_TO_DRIVER_CHANNEL + """
import json
written = 0
for i in range(200):
    written += forge(json.dumps({"event": "tool_call", "call_id": f"x{i}",
                                 "name": "secret_" + "a" * 100000, "args": [], "kwargs": {}})
                     + "\\n")
written
""", "flood", timeout=20)
    assert flood["id"] == "flood"
    # The forgeries were written (into the driver's channel, at least once each).
    assert flood["error"] is None and int(flood["value"]) >= 200, flood
    with srv.cond:
        forwarded = [e for e in srv.events if str(e.get("name", "")).startswith("secret_")]
    assert forwarded == []
    assert srv.call({"id": "ping", "op": "ping"})["ok"] is True
    with open(f"/proc/{srv.proc.pid}/status") as status:
        rss_kib = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
    assert rss_kib < 200 * 1024, f"server grew to {rss_kib} KiB"


def test_client_fields_cannot_confuse_the_server(server):
    srv = server()
    session = open_session(srv, "s")
    srv.send({"id": "slow", "op": "exec", "session": session, "code": "import time; time.sleep(0.5)"})
    srv.send({"id": "internal", "op": "exec", "session": session, "code": "1", "internal": "yes"})
    assert srv.wait("slow")["ok"] is True
    assert srv.wait("internal")["value"] == "1"
    huge = srv.call({"id": "huge", "op": "exec", "session": session, "code": "1", "timeout": 1e10})
    assert huge["ok"] is False and huge["error"]["type"] == "BadRequest"
    deep = "[" * 100000 + "]" * 100000
    srv.proc.stdin.write('{"id": ' + deep + ', "op": "ping"}\n')
    srv.proc.stdin.flush()
    assert srv.call({"id": "after", "op": "ping"})["ok"] is True
    assert srv.proc.poll() is None


LIST_FDS = ("import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))")


@pytest.mark.parametrize("pool", [False, True], ids=["fresh", "pooled"])
def test_run_payloads_hold_only_stdio(server, pool):
    """The supervisor of a server holds every sandbox's pipes and its control socket; init
    closes all of it before the payload exists, for fresh and for pooled sandboxes alike."""
    srv = server(*(["--pool", "1"] if pool else []))
    if pool:
        time.sleep(1)  # let the pool fill, so the request lands on a pooled sandbox
    # The listing itself opens one more descriptor (3).
    answer = srv.call({"id": "fds", "op": "run", "code": LIST_FDS})
    assert answer["exit_code"] == 0, answer
    assert answer["stdout"] == "[0, 1, 2, 3]\n"


# What a run request brings with it, as the payload sees it.
REQUEST_AS_SEEN = ("echo \"$GREETING\"; pwd; ulimit -St; ulimit -Ht; cat; "
                   "ls /proc/self/fd; echo to-stderr >&2")


@pytest.mark.parametrize("pool", [False, True], ids=["fresh", "pooled"])
def test_a_run_gets_its_requests_command_environment_workdir_stdio_and_cpu_time(server, pool):
    """A pooled sandbox's payload is set up before its request exists (it waits, confined, for
    it): the command, environment, working directory, stdin, stdout, stderr and CPU time it then
    runs with must be the request's, as in a sandbox made for the request, and the CPU time must
    still be enforced."""
    srv = server(*(["--pool", "1"] if pool else []))
    answers = []
    for cpu_time in (7, 3):
        if pool:
            time.sleep(1)  # let the pool fill, so the request lands on a pooled sandbox
        answers.append(srv.call({
            "id": f"seen-{cpu_time}", "op": "run", "command": ["sh", "-c", REQUEST_AS_SEEN],
            "env": {"GREETING": f"hello {cpu_time}"}, "workdir": "/tmp",
            "stdin": f"input {cpu_time}\n", "cpu_time": cpu_time}))
    for answer, cpu_time in zip(answers, (7, 3)):
        assert answer["exit_code"] == 0, answer
        # The listing opens one more descriptor (3): nothing of init's or the request's way in.
        assert answer["stdout"] == (f"hello {cpu_time}\n/tmp\n{cpu_time}\n{cpu_time + 1}\n"
                                    f"input {cpu_time}\n0\n1\n2\n3\n"), answer
        assert answer["stderr"] == "to-stderr\n", answer
    if pool:
        time.sleep(1)
    spin = srv.call({"id": "spin", "op": "run", "command": ["sh", "-c", "while :; do :; done"],
                     "cpu_time": 1, "timeout": 30}, timeout=60)
    assert not spin["timed_out"], spin
    assert spin["signal"] in (signal.SIGXCPU, signal.SIGKILL), spin
    assert spin["cpu_ms"] < 5000, spin


@pytest.mark.parametrize("pool", [False, True], ids=["fresh", "pooled"])
def test_a_tight_descriptor_limit_holds_and_still_lets_the_request_in(server, pool):
    """--nofile 6: the payload gets that limit, pooled or not. A pooled payload waits for its
    request with more descriptors open than a fresh one (its start signal, its status), so the
    limit is set once the request's stdio has arrived: set before, the kernel would cut the
    three descriptors off the request."""
    srv = server("--nofile", "6", *(["--pool", "1"] if pool else []))
    if pool:
        time.sleep(1)
    answer = srv.call({"id": "nofile", "op": "run", "command": ["sh", "-c", "ulimit -n; cat"],
                       "stdin": "through\n"})
    assert answer["exit_code"] == 0, answer
    assert answer["stdout"] == "6\nthrough\n", answer


def links_of_descriptors(pid):
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return links


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="needs root: the server's supervisor is not dumpable, so its "
                           "descriptors and its sandboxes' namespaces are root's to read")
def test_the_supervisor_holds_the_mount_namespace_of_each_live_sandbox_and_no_other(server):
    """The supervisor takes each init's mount namespace, to have it torn down only once the
    sandbox's end is reported (runtime/init.h), by a process of its own. One kept after that,
    there or in that process, would keep an ended sandbox's writable layer in memory for good."""
    srv = server("--pool", "1")
    time.sleep(1)
    for index in range(3):
        answer = srv.call({"id": f"run-{index}", "op": "run", "code": "open('/tmp/x', 'w')"})
        assert answer["exit_code"] == 0, answer
    time.sleep(1)  # the pool's refill
    supervisor = next(child for child in children(srv.proc.pid)
                      if any(link.endswith("/dev/fuse") for link in links_of_descriptors(child)))
    own_namespace = os.readlink(f"/proc/{supervisor}/ns/mnt")
    # Its children: the image server (it holds /dev/fuse), the process that releases ended
    # sandboxes' namespaces (in the supervisor's own), and inits.
    inits, helpers = [], []
    for child in children(supervisor):
        links = links_of_descriptors(child)
        if any(link.endswith("/dev/fuse") for link in links):
            continue
        (helpers if os.readlink(f"/proc/{child}/ns/mnt") == own_namespace else inits).append(child)
    held = sorted(link for link in links_of_descriptors(supervisor) if link.startswith("mnt:"))
    assert len(inits) == 1, inits  # the pooled sandbox, waiting
    assert held == [os.readlink(f"/proc/{inits[0]}/ns/mnt")]
    assert len(helpers) == 1, helpers
    assert not [link for link in links_of_descriptors(helpers[0]) if link.startswith("mnt:")]


def test_session_code_holds_only_stdio_and_its_drivers_channel(server):
    srv = server()
    s = open_session(srv, "s")
    seen = execute(srv, s, """
import os, subprocess
child = subprocess.run(['python3', '-c', %r], capture_output=True, text=True).stdout
sorted(int(fd) for fd in os.listdir('/proc/self/fd')), child
""" % LIST_FDS, "fds")
    assert seen["error"] is None, seen
    own, child = eval(seen["value"])
    # A program the code starts gets stdio only; the interpreter itself has the driver's channel
    # and capture files besides (none of them reach past its own sandbox).
    assert child == "[0, 1, 2, 3]\n"
    assert len(own) <= 10, own


def test_a_flood_of_output_stays_bounded_in_the_server(server):
    """Without an output limit of its own, a run keeps 16 MiB of each stream; the rest is
    dropped, so the server's memory does not grow with a payload's output (512 MiB of it here;
    the answer's JSON costs a constant multiple of the 16 MiB kept)."""
    srv = server()
    answer = srv.call({"id": "flood", "op": "run",
                       "command": ["sh", "-c", "head -c 536870912 /dev/zero | tr '\\\\0' x"]},
                      timeout=120)
    assert answer["exit_code"] == 0, answer["stderr"]
    assert answer["stdout_truncated"] is True
    assert len(answer["stdout"]) == 16 * 1024 * 1024
    with open(f"/proc/{srv.proc.pid}/status") as status:
        peak_kib = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
    assert peak_kib < 320 * 1024, f"server peaked at {peak_kib} KiB"

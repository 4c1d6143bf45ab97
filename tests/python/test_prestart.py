"""Pre-started interpreters (`sqbox serve --prestart N --preload ...`, `Sandbox.run_python`)
against the real binary and image: code runs as `python3 -c` would, every execution gets a
sandbox nothing else ran in (nothing one request leaves reaches the next, even while the first
still runs), and the limits hold per execution.
"""
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import sqbox

ROOT = Path(__file__).resolve().parents[2]

PRELOAD = ["json", "decimal"]


# Each test runs against both ways of serving run_python ahead of the request: a pool of
# pre-started interpreters (--prestart), and sandboxes forked from one warm interpreter (--zygote).
WAYS = {"prestart": {"prestart": 2}, "zygote": {"zygote": True}}


# Mapping uid 0 into a new user namespace takes CAP_SETFCAP, which the zygote does not keep.
ZYGOTE_NEEDS_A_USER = pytest.mark.skipif(
    os.geteuid() == 0, reason="--zygote: the kernel lets no process without CAP_SETFCAP map "
    "uid 0 into a user namespace of its own; tested as a plain user")


@pytest.fixture(scope="module", params=[
    "prestart", pytest.param("zygote", marks=ZYGOTE_NEEDS_A_USER)])
def way(request):
    return request.param


@pytest.fixture(scope="module")
def prestarted(sqbox_bin, python_image, way):
    with sqbox.Sandbox(python_image, binary=sqbox_bin, preload=PRELOAD, timeout=30,
                       **WAYS[way]) as box:
        yield box


@pytest.fixture(scope="module")
def limited(sqbox_bin, python_image, way):
    """Sandboxes under small server-wide limits, which each execution gets."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin, timeout=30,
                       extra_args=["--memory", "256M", "--pids", "32"], **WAYS[way]) as box:
        yield box


# Code whose result must not tell a pre-started interpreter from `python3 -c`.
AS_PYTHON_C = [
    "print(6 * 7)",
    "1/0",
    "def f():\n    raise ValueError('deep')\nf()",
    "syntax error here",
    "import sys; sys.exit(3)",
    "import sys; sys.exit('a message')",
    "import sys; print(sys.argv, __name__, sys.path[0] == '', sorted(dir()))",
    "print(__loader__, __spec__, __doc__, __annotations__)",
    "import sys; print(sys.stdin.read().upper())",
    "import os, sys; print(os.getcwd(), sys.flags.dont_write_bytecode, sys.flags.isolated)",
    "import subprocess; print(subprocess.run(['python3', '-c', 'print(5)'],"
    " capture_output=True, text=True).stdout, end='')",
    "import sys; sys.stdout.write('no newline'); sys.stderr.write('err')",
    # What an interpreter's exit does: waits for threads, runs atexit functions, flushes files
    # left open (a zygote's request ends without tearing the interpreter down).
    "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), print('thread')))"
    ".start()\nprint('main')",
    "import atexit; atexit.register(print, 'at exit'); print('main')",
    "f = open('/dev/stdout', 'w'); f.write('left open, unflushed'); print('main')",
    "import sys; sys.exit(-1)",
    "import sys; sys.exit(None)",
    "raise SystemExit(False)",
    "import sys; sys.stdout.close()",
    "import io, sys; print('a'); sys.stdout = io.TextIOWrapper(sys.stdout.buffer, "
    "encoding='utf-8'); print('b')",
    "import gzip, sys; f = gzip.GzipFile(fileobj=sys.stdout.buffer, mode='wb', mtime=0); "
    "f.write(b'x' * 1000)",
    "raise SystemExit(1 << 70)",
]


@pytest.mark.parametrize("code", AS_PYTHON_C)
def test_run_python_runs_code_as_python_c_does(prestarted, code):
    fast = prestarted.run_python(code, stdin="some input\n")
    cold = prestarted.run(["python3", "-c", code], stdin="some input\n")
    assert fast.prestarted is True
    assert (fast.exit_code, fast.stdout, fast.stderr) == (cold.exit_code, cold.stdout,
                                                          cold.stderr)


# Signals the code sends itself, and orphans it leaves: as under `python3 -c`, whose process is
# not its namespace's pid 1 (a pid 1 ignores signals it has no handler for, and reaps orphans).
ORPHAN_ZOMBIES = """
import os, time
middle = os.fork()
if middle == 0:
    if os.fork() == 0:
        os._exit(0)
    os._exit(0)
os.waitpid(middle, 0)
time.sleep(0.5)
states = [open('/proc/%s/stat' % p).read().rsplit(')', 1)[1].split()[0]
          for p in os.listdir('/proc') if p.isdigit()]
print(states.count('Z'))
"""
SIGNALS_AND_ORPHANS = [
    "import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGTERM)",
    "import signal, time; signal.alarm(1); time.sleep(20); print('not reached')",
    "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ORPHAN_ZOMBIES,
    # Its pid 1 (sqbox's init, which refuses them, or the zygote's copy, which ignores them) goes
    # on, and so does the code.
    "import os, signal, time\nfor s in ('SIGKILL', 'SIGTERM', 'SIGINT', 'SIGHUP', 'SIGSTOP'):\n"
    "    try:\n        os.kill(1, getattr(signal, s))\n    except PermissionError:\n"
    "        pass\ntime.sleep(0.2)\nprint('alive')",
]


@pytest.mark.parametrize("code", SIGNALS_AND_ORPHANS,
                         ids=["sigterm", "alarm", "sigkill", "orphan", "signals-to-pid-1"])
def test_signals_and_orphans_of_the_code_are_as_under_python_c(prestarted, code):
    fast = prestarted.run_python(code, timeout=15)
    cold = prestarted.run(["python3", "-c", code], timeout=15)
    assert fast.prestarted is True and not fast.timed_out, fast
    assert (fast.exit_code, fast.signal, fast.stdout, fast.stderr) == (
        cold.exit_code, cold.signal, cold.stdout, cold.stderr), (fast, cold)


def test_signals_to_its_process_group_reach_no_other_request(prestarted):
    """kill(0, sig) signals the caller's process group: the request's own, never the zygote's
    or that of the sandboxes waiting for requests, so a request running meanwhile, the next
    request and the server go on. (From Linux 6.12 Landlock's signal scope refuses it as well;
    before, only the request's own session does.)"""
    slow = []
    running = threading.Thread(target=lambda: slow.append(prestarted.run_python(
        "import time; time.sleep(4); print('survived')", timeout=20)))
    running.start()
    time.sleep(1)
    for name in ("SIGINT", "SIGTERM", "SIGKILL"):
        result = prestarted.run_python(f"import os, signal; os.kill(0, signal.{name})",
                                       timeout=10)
        assert result.prestarted and not result.timed_out, (name, result)
    killed = prestarted.run_python("import os, signal; os.kill(0, signal.SIGKILL)", timeout=10)
    assert killed.signal == 9 and killed.exit_code == 128 + 9, killed
    running.join(30)
    assert slow and slow[0].stdout == "survived\n" and slow[0].exit_code == 0, slow
    after = prestarted.run_python("print('next')")
    assert after.prestarted and after.stdout == "next\n", after


def test_preloaded_modules_are_imported_before_the_request(prestarted):
    probe = "import sys; print(sorted(m for m in ('json', 'decimal', 'email') if m in sys.modules))"
    assert prestarted.run_python(probe).stdout == "['decimal', 'json']\n"
    assert prestarted.run(["python3", "-c", probe]).stdout == "[]\n"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to tell a pinned sandbox from a free one")
def test_the_code_may_use_every_cpu_a_plain_run_may(prestarted):
    # The code, and what it starts, may run on every CPU the server may: a sandbox made ahead
    # (or a zygote's copy) has none taken from it.
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    probe = f"{show}; import subprocess, sys; subprocess.run([sys.executable, '-c', {show!r}])"
    plain = prestarted.run(["python3", "-c", probe]).stdout
    assert plain.splitlines() == [str(sorted(os.sched_getaffinity(0)))] * 2, plain
    for _ in range(3):  # a sandbox made at once for a request, then ones made ahead
        assert prestarted.run_python(probe).stdout == plain


def test_results_have_the_shape_of_a_run(prestarted):
    result = prestarted.run_python("print('x')")
    assert result.ok and result.prestarted
    assert result.signal is None and not result.timed_out and not result.oom_killed
    assert result.wall_ms > 0 and result.cpu_ms >= 0


# A request that leaves everything it can behind: module and builtin globals, /tmp, the root
# layer, /dev/shm, the environment, processes (a child and a daemon of its own session), a TCP
# listener and an abstract Unix socket, System V shared memory, and a large block of memory.
PLANT = r"""
import builtins, ctypes, json, os, socket, subprocess, sys
MARK = sys.stdin.readline().strip()
json.PLANTED = builtins.PLANTED = MARK
for path in ("/tmp/" + MARK, "/" + MARK, "/dev/shm/" + MARK, "/var/tmp/" + MARK):
    with open(path, "w") as f:
        f.write(MARK)
os.environ["PLANTED"] = MARK
os.putenv("PLANTED_PUTENV", MARK)
child = subprocess.Popen(["sleep", "60"])
subprocess.Popen(["python3", "-c", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                  "    time.sleep(60)"]).wait()
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 47311))
tcp.listen()
unix = socket.socket(socket.AF_UNIX)
unix.bind("\0" + MARK)
unix.listen()
libc = ctypes.CDLL(None, use_errno=True)
shm_id = libc.shmget(0x5eed, 4096, 0o1666)  # IPC_CREAT | 0666
block = bytearray(MARK.encode() * (32 * 1024 * 1024 // len(MARK)))
import random
print(MARK, shm_id >= 0, random.random(), hash("same text"), os.urandom(8).hex(), flush=True)
"""

LOOK = r"""
import builtins, ctypes, json, os, socket, sys
MARK = sys.stdin.readline().strip()
found = []
if getattr(json, "PLANTED", None) or getattr(builtins, "PLANTED", None):
    found.append("globals")
for path in ("/tmp/" + MARK, "/" + MARK, "/dev/shm/" + MARK, "/var/tmp/" + MARK):
    if os.path.exists(path):
        found.append(path)
if "PLANTED" in os.environ or "PLANTED_PUTENV" in os.environ:
    found.append("environment")
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
if set(pids) - {1, os.getpid()}:  # sqbox's init and this, or (--zygote) this as pid 1
    found.append("processes %r" % pids)
for family, address in ((socket.AF_INET, ("127.0.0.1", 47311)), (socket.AF_UNIX, "\0" + MARK)):
    s = socket.socket(family)
    try:
        s.connect(address)
        found.append("listener %r" % (address,))
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0x5eed, 0, 0) >= 0:
    found.append("System V shared memory")
with open("/proc/self/status") as status:
    rss_kib = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
import random
print(found, rss_kib, random.random(), hash("same text"), os.urandom(8).hex())
"""


def _planted(result, mark):
    assert result.exit_code == 0 and result.prestarted, result
    fields = result.stdout.split()
    assert fields[:2] == [mark, "True"], result
    return fields[2:]


def _looked(result):
    assert result.exit_code == 0 and result.prestarted, result
    found, rest = result.stdout.rsplit("]", 1)
    rss_kib, *draws = rest.split()
    return found + "]", int(rss_kib), draws


def _fresh_draws(way, planted, draws):
    """Fresh random state and urandom, and (but from one zygote, whose children share the seed
    its interpreter drew at its start: SECURITY.md) hash seed: nothing drawn in one request
    tells the next."""
    random_and_urandom = [planted[0], planted[2]], [draws[0], draws[2]]
    assert all(a != b for a, b in zip(*random_and_urandom)), (planted, draws)
    if way == "zygote":
        assert planted[1] == draws[1]
    else:
        assert planted[1] != draws[1], (planted, draws)


def test_nothing_a_request_leaves_reaches_the_next(prestarted, way):
    for _ in range(3):
        mark = "planted-" + uuid.uuid4().hex
        planted = _planted(prestarted.run_python(PLANT, stdin=mark + "\n"), mark)
        found, rss_kib, draws = _looked(prestarted.run_python(LOOK, stdin=mark + "\n"))
        assert found == "[]"
        assert rss_kib < 32 * 1024  # the 32 MiB block is not in the next interpreter
        _fresh_draws(way, planted, draws)


def test_a_request_still_running_is_out_of_reach_of_the_others(prestarted, way):
    """The planting request still holds everything (sleeping) while others run."""
    mark = "planted-" + uuid.uuid4().hex
    results = {}
    planter = threading.Thread(target=lambda: results.setdefault(
        "plant", prestarted.run_python(PLANT + "import time; time.sleep(4)\n",
                                       stdin=mark + "\n")))
    planter.start()
    time.sleep(2)
    looks = [prestarted.run_python(LOOK, stdin=mark + "\n") for _ in range(3)]
    planter.join()
    planted = _planted(results["plant"], mark)
    for look in looks:
        found, _, draws = _looked(look)
        assert found == "[]"
        _fresh_draws(way, planted, draws)


def test_the_timeout_counts_from_the_request_and_holds(prestarted):
    time.sleep(2.5)  # the pre-started sandboxes have waited longer than the timeout below
    slow_but_in_time = prestarted.run_python("import time; time.sleep(1); print('done')",
                                             timeout=2)
    assert slow_but_in_time.prestarted and slow_but_in_time.stdout == "done\n", slow_but_in_time
    started = time.monotonic()
    endless = prestarted.run_python("while True: pass", timeout=1)
    assert endless.prestarted and endless.timed_out and endless.exit_code == 124, endless
    assert time.monotonic() - started < 20


def test_memory_and_pids_limits_hold_per_execution(limited):
    big = limited.run_python("x = bytearray(512 * 1024 * 1024); print('allocated')")
    assert big.prestarted and big.exit_code != 0 and "allocated" not in big.stdout, big
    forks = limited.run_python(
        "import os\nn = 0\nfor _ in range(64):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        import time; time.sleep(5); os._exit(0)\n    n += 1\n"
        "print(n)", timeout=20)
    assert forks.prestarted and forks.exit_code == 0, forks
    assert 0 < int(forks.stdout) < 32
    # The next execution has the whole limit again: the previous one's memory and processes
    # went with its sandbox.
    again = limited.run_python(
        "import os, time\nx = bytearray(128 * 1024 * 1024)\nfor _ in range(24):\n"
        "    if os.fork() == 0:\n        time.sleep(2); os._exit(0)\nprint('ok')")
    assert again.prestarted and again.stdout == "ok\n", again


def test_output_and_cpu_time_limits_hold_per_execution(prestarted):
    flood = prestarted.run_python("print('x' * 100000)", output_limit=1000)
    assert flood.prestarted and flood.stdout_truncated and len(flood.stdout) == 1000, flood
    started = time.monotonic()
    spin = prestarted.run_python("while True: pass", cpu_time=1, timeout=25)
    assert spin.prestarted and not spin.timed_out, spin
    assert spin.signal in (9, 24) and spin.exit_code in (128 + 9, 128 + 24), spin
    assert 500 < spin.cpu_ms < 1150, spin  # what was asked for, not a second more
    assert time.monotonic() - started < 20
    # The start and the imports do not count against the execution's CPU time.
    short = prestarted.run_python("import time\nend = time.process_time() + 0.5\n"
                                  "while time.process_time() < end: pass\nprint('ok')",
                                  cpu_time=1)
    assert short.prestarted and short.stdout == "ok\n", short


def test_environment_and_workdir_of_the_request(prestarted):
    result = prestarted.run_python(
        "import os, subprocess; print(os.environ['TOKEN'], os.getcwd(),"
        " subprocess.run(['sh', '-c', 'echo $TOKEN'], capture_output=True, text=True).stdout,"
        " end='')", env={"TOKEN": "abc"})
    assert result.prestarted and result.stdout == "abc / abc\n", result


@pytest.mark.parametrize("kwargs", [{"memory": "1G"}, {"env": {"PYTHONPATH": "/opt/extra"}},
                                    {"env": {"LC_ALL": "C"}}])
def test_requests_needing_their_own_start_get_a_fresh_python(prestarted, kwargs):
    result = prestarted.run_python("import os, sys; print('/opt/extra' in sys.path,"
                                   " os.environ.get('LC_ALL'))", **kwargs)
    assert result.exit_code == 0 and result.prestarted is False, result
    expected_path = "PYTHONPATH" in kwargs.get("env", {})
    expected_lc = kwargs.get("env", {}).get("LC_ALL")
    assert result.stdout == f"{expected_path} {expected_lc}\n"


def test_async_run_python(sqbox_bin, python_image):
    async def main():
        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin, prestart=2) as box:
            results = await asyncio.gather(*(box.run_python(f"print({i} * 2)")
                                             for i in range(6)))
        return results

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(6)]
    assert all(r.prestarted for r in results)


def test_a_preload_the_image_lacks_turns_prestart_off(sqbox_bin, python_image):
    """The requests still run (each in a python3 -c sandbox of its own), and the server says
    once why the pre-started interpreters are off."""
    requests = "".join(f'{{"id": {i}, "op": "run_python", "code": "print({i})"}}\n'
                       for i in range(5))
    proc = subprocess.run(
        [sqbox_bin, "serve", "--prestart", "2", "--preload", "json,no_such_module_here",
         python_image], input=requests, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answers = [line for line in proc.stdout.splitlines() if line]
    assert len(answers) == 5
    for i in range(5):
        assert f'"id":{i},' in answers[i] or any(f'"id":{i},' in a for a in answers)
    assert all('"exit_code":0' in a and '"prestarted":false' in a for a in answers), answers
    warnings = [l for l in proc.stderr.splitlines() if "pre-started" in l]
    assert warnings == ["sqbox: warning: pre-started interpreters keep failing "
                        "(ModuleNotFoundError: No module named 'no_such_module_here'); "
                        "--prestart is off"], proc.stderr


@ZYGOTE_NEEDS_A_USER
def test_a_preload_the_image_lacks_turns_the_zygote_off(sqbox_bin, python_image):
    """As for pre-started interpreters: the requests run, each in a python3 -c sandbox of its
    own, and the server says once why the zygote is off."""
    requests = "".join(f'{{"id": {i}, "op": "run_python", "code": "print({i})"}}\n'
                       for i in range(3))
    proc = subprocess.run(
        [sqbox_bin, "serve", "--zygote", "--preload", "json,no_such_module_here", python_image],
        input=requests, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answers = [line for line in proc.stdout.splitlines() if line]
    assert len(answers) == 3
    assert all('"exit_code":0' in a and '"prestarted":false' in a for a in answers), answers
    warnings = [l for l in proc.stderr.splitlines() if "zygote" in l]
    assert warnings == ["sqbox: warning: the zygote keeps failing (ModuleNotFoundError: No "
                        "module named 'no_such_module_here'); --zygote is off"], proc.stderr


def _parent(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


def _descends(pid, ancestor):
    while pid > 1:
        if pid == ancestor:
            return True
        pid = _parent(pid)
    return False


@ZYGOTE_NEEDS_A_USER
def test_a_zygote_that_dies_fails_its_requests_and_another_takes_over(sqbox_bin, python_image):
    """A request cannot reach its zygote (new pid namespace); a zygote killed from outside ends
    the requests it served with an error, and the next requests get a new zygote."""
    with sqbox.Sandbox(python_image, binary=sqbox_bin, zygote=True, timeout=30) as box:
        first = box.run_python("import os; print(os.getpid(), sorted(os.listdir('/proc')))")
        # Its own pid namespace: its pid 1 (the zygote's copy that made the sandbox) and itself.
        assert first.prestarted and first.stdout == "2 ['1', '2', 'self', 'thread-self']\n", first
        # The zygote's copies (the sandbox made ahead for the next request: its pid 1 and the
        # process that will run the code) have its command line too; the zygote is the one
        # whose parent is none of them.
        copies = {int(pid) for pid in subprocess.run(
            ["pgrep", "-f", "-u", str(os.getuid()), "sqbox-zygote-lower"],
            stdout=subprocess.PIPE, text=True).stdout.split() if _descends(int(pid), box.pid)}
        zygotes = [pid for pid in copies if _parent(pid) not in copies]
        assert len(zygotes) == 1, (zygotes, copies)
        errors = []

        def served_when_the_zygote_dies():
            try:
                errors.append(box.run_python("import time; time.sleep(10)"))
            except sqbox.SqboxError as error:
                errors.append(error)

        slow = threading.Thread(target=served_when_the_zygote_dies)
        slow.start()
        time.sleep(1.5)
        os.kill(int(zygotes[0]), 9)
        slow.join(20)
        assert len(errors) == 1 and "the zygote ended while this request ran" in str(errors[0])
        after = box.run_python("print('served again')")
        assert after.prestarted and after.stdout == "served again\n", after


@pytest.mark.parametrize("options, message", [
    (["--prestart", "1", "--preload", "json,os;import x"], "is not a Python module name"),
    (["--prestart", "1", "--preload", ".json"], "is not a Python module name"),
    (["--preload", "json"], "give --prestart N or --zygote too"),
    (["--zygote", "--prestart", "1"], "--zygote and --prestart both serve run_python"),
    (["--zygote", "--seccomp", "none"], "--zygote needs a seccomp profile"),
    (["--zygote", "--root"], "--zygote: not as root or with --root"),
])
def test_bad_preload_options_are_refused(sqbox_bin, python_image, options, message):
    proc = subprocess.run([sqbox_bin, "serve", *options, python_image], input="",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 125
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_run_python_wants_code(sqbox_bin, python_image):
    request = '{"id": 1, "op": "run_python", "command": ["true"]}\n{"id": 2, "op": "run_python"}\n'
    proc = subprocess.run([sqbox_bin, "serve", "--prestart", "1", python_image], input=request,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0
    answers = proc.stdout.splitlines()
    assert len(answers) == 2 and all('"ok":false' in a and "BadRequest" in a for a in answers)


def test_readme_run_python_example_runs(sqbox_bin, python_image, tmp_path):
    text = (ROOT / "python" / "README.md").read_text()
    section = text.split("\n## One-shot Python, fast: `Sandbox.run_python`\n", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert len(blocks) == 1 and '"python.sqsh"' in blocks[0]
    script = tmp_path / "example.py"
    script.write_text(blocks[0].replace('"python.sqsh"', repr(python_image)))
    env = dict(os.environ, SQBOX_BIN=sqbox_bin, PYTHONPATH=str(ROOT / "python"))
    done = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

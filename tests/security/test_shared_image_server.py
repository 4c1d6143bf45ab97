"""The shared image server (SECURITY.md, "The shared image server"): one server per user and
image that outlives a sandbox. Each test gives sqbox a cache directory of its own, so it starts
the server it looks at, and attacks a promise: sandboxes of an image share one mount and nothing
one payload does changes what the next sees; its parser is confined as a sandbox's own; only the
caller reaches it; a crash ends its sandboxes with one line; after the idle time nothing is left.
"""
import collections
import contextlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from escape_support import GRACE, SANDBOX_TIMEOUT
from test_image_server import SERVER_DATA_LIMIT, mount_points, status_fields

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

from host_mounts import fuse_connections, new_fuse_connections  # noqa: E402
from host_processes import children  # noqa: E402

UNPRIVILEGED_USER = "sqbox-test"


@pytest.fixture
def cache():
    """A cache directory of the test's own: its sqbox runs start (and find) their own server.
    Directly in /tmp, so another user can be shown the way to it."""
    directory = Path(tempfile.mkdtemp(prefix="sqbox-image-servers-test-", dir="/tmp"))
    # Servers of earlier tests (other caches) may serve the same image under the same name.
    _EARLIER[directory] = {pid for pid, _ in _image_servers()}
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


_EARLIER = {}

def environment(cache, idle=None):
    env = dict(os.environ, SQBOX_CACHE_DIR=str(cache))
    env.pop("SQBOX_IMAGE_SERVER_IDLE", None)
    if idle is not None:
        env["SQBOX_IMAGE_SERVER_IDLE"] = str(idle)
    return env


def run_json(box, cache, image, command, tmp_path, idle=None, options=(), timeout=None):
    record = tmp_path / f"result-{time.monotonic_ns()}.json"
    result = box.run(image, *command, options=["--json", str(record), *options],
                     env=environment(cache, idle), timeout=timeout)
    return result, json.loads(record.read_text())


def shared_servers(cache):
    """(server, its confined image server) of each shared server whose socket is in `cache`:
    one started since the test began, with a socket of that name there."""
    sockets = {p.name for p in (cache / "image-servers").glob("*.socket")}
    return [(pid, kids) for pid, kids in _image_servers(sockets)
            if pid not in _EARLIER.get(cache, set())]


def _image_servers(sockets=None):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            ppid = int(status_fields(entry)["PPid"])
        except (OSError, KeyError):
            continue
        if argv[1:3] == [b"image-server", b"--socket"] and (
                sockets is None or argv[3].decode() in sockets):
            # The server and the confined parser it forked carry the same command line.
            if argv[:4] != _command_line(ppid)[:4]:
                found.append((int(entry), children(int(entry))))
    return found


def _command_line(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_sandboxes_of_an_image_share_one_server_which_leaves_nothing_after_its_idle_time(
        box, cache, tmp_path):
    connections_before = fuse_connections()
    first, first_record = run_json(box, cache, box.busybox_image, ["md5sum", "/bin/busybox"],
                                   tmp_path, idle=2)
    assert first.returncode == 0, first.stderr
    assert first_record["image_access"] == "shared"
    servers = shared_servers(cache)
    assert len(servers) == 1 and len(servers[0][1]) == 1, servers
    second, second_record = run_json(box, cache, box.busybox_image, ["md5sum", "/bin/busybox"],
                                     tmp_path, idle=2)
    assert second.returncode == 0 and second_record["image_access"] == "shared"
    assert shared_servers(cache) == servers  # the same server, not a second one
    assert second.stdout == first.stdout
    # Idle for 2 s: the server, its parser, its socket and its FUSE connection go.
    pids = [servers[0][0], *servers[0][1]]
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 15), pids
    assert list((cache / "image-servers").iterdir()) == []  # neither socket nor lock
    assert new_fuse_connections(connections_before) == []
    # --image-server-idle 0: a server of the sandbox's own, none left running.
    own, own_record = run_json(box, cache, box.busybox_image, ["true"], tmp_path,
                               options=["--image-server-idle", "0"])
    assert own.returncode == 0 and own_record["image_access"] == "fuse"
    assert shared_servers(cache) == []


def test_the_shared_servers_parser_is_confined_like_a_sandboxs_own(box, cache, tmp_path):
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(server, [parser])] = shared_servers(cache)
    try:
        for task in os.listdir(f"/proc/{parser}/task"):
            status = status_fields(f"{parser}/task/{task}")
            for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert int(status[capability_set], 16) == 0, (task, capability_set, status)
            assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
        limits = {line[:26].strip(): line[26:].split()[:2]
                  for line in Path(f"/proc/{parser}/limits").read_text().splitlines()[1:]}
        assert limits["Max data size"] == [str(SERVER_DATA_LIMIT)] * 2, limits
        mounts = mount_points(parser)
        assert [m[0] for m in mounts] == ["/", "/image"], mounts
        assert mounts[1][1] == "fuse.sqbox" and "ro" in mounts[1][3], mounts
        # The server itself: no new privileges, not dumpable (the caller's own processes cannot
        # look into it unless root), stdio on /dev/null, a session of its own, no environment.
        status = status_fields(server)
        assert status["NoNewPrivs"] == "1", status
        # Signals of its own: none of the launcher's blocked or ignored ones (it outlives the run
        # and must still end on SIGTERM).
        assert int(status["SigBlk"], 16) == 0 and int(status["SigIgn"], 16) == 0, status
        assert os.getsid(server) != os.getsid(0)
        if os.geteuid() == 0:
            assert Path(f"/proc/{server}/environ").read_bytes() == b""
            for fd in (0, 1, 2):
                assert os.readlink(f"/proc/{server}/fd/{fd}") == "/dev/null"
        else:
            with pytest.raises(PermissionError):
                os.listdir(f"/proc/{server}/fd")
    finally:
        os.kill(server, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


# Run by one sandbox: everything a payload can try on the image, each attempt's outcome
# printed; the next sandbox then reads what the image shows.
TAMPER = r"""
for f in /bin/busybox /etc/passwd /etc/group; do
  echo tampered >> "$f"; chmod 4777 "$f"; touch -d 2001-01-01 "$f"
done
rm -rf /usr /sbin; mkdir /planted; ln -s / /etc/planted
mount -o remount,rw / 2>&1; mount -t tmpfs x /bin 2>&1
cat /bin/busybox > /dev/null; ls -lR / > /dev/null 2>&1; echo done
"""
# What a sandbox sees of the image: names, modes, owners, sizes, times and contents.
# (/etc without times: sqbox writes passwd, group, hosts and the like into the sandbox's own
# layer as each sandbox starts.)
VIEW = r"""
cd / && find bin lib sbin usr -xdev 2>/dev/null | sort | while read -r f; do
  stat -c '%n %f %u %g %s %Y' "$f"; done
find etc -xdev | sort | while read -r f; do stat -c '%n %f %u %g' "$f"; done; md5sum bin/busybox
"""


def test_nothing_one_payload_does_changes_what_the_next_sandbox_sees(box, cache, tmp_path):
    fresh, _ = run_json(box, cache, box.busybox_image, ["sh", "-c", VIEW], tmp_path,
                        options=["--image-server-idle", "0"])
    assert fresh.returncode == 0 and "bin/busybox" in fresh.stdout, fresh.stderr
    before, record = run_json(box, cache, box.busybox_image, ["sh", "-c", VIEW], tmp_path,
                              idle=30)
    assert record["image_access"] == "shared"
    tamper, _ = run_json(box, cache, box.busybox_image, ["sh", "-c", TAMPER], tmp_path, idle=30)
    assert "done" in tamper.stdout, tamper.stderr
    after, record = run_json(box, cache, box.busybox_image, ["sh", "-c", VIEW], tmp_path, idle=30)
    assert record["image_access"] == "shared"
    assert len(shared_servers(cache)) == 1  # all three shared it
    assert after.stdout == before.stdout == fresh.stdout


def test_a_payload_finds_no_way_to_the_server(box, cache, tmp_path):
    result, record = run_json(box, cache, box.busybox_image, ["sh", "-c", (
        "find / -xdev -type s 2>/dev/null | sed 's/^/socket: /'; "
        "echo \"unix: $(grep -c image-servers /proc/net/unix)\"; "
        f"ls -d {cache}/image-servers 2>&1 | sed 's/^/cache: /'; echo end")], tmp_path, idle=30)
    assert record["image_access"] == "shared"
    lines = result.stdout.splitlines()
    assert lines[-1] == "end", result.stderr
    assert [line for line in lines if line.startswith("socket: ")] == [], lines
    assert "unix: 0" in lines, lines
    [seen] = [line for line in lines if line.startswith("cache: ")]
    assert "No such file" in seen, lines


def image_identity(image, binary):
    """The identity a launcher sends (runtime/shared_image.cpp, image_identity): anyone who can
    stat the image and the binary and read the caller's cgroups can make it."""
    f, b = os.stat(image), os.stat(os.path.realpath(binary))
    def time_of(ns):
        return f"{ns // 10**9}.{ns % 10**9}"
    # The sqbox it starts runs in this process's cgroups.
    return (f"image {f.st_dev:x}:{f.st_ino:x} {f.st_size} {time_of(f.st_mtime_ns)} "
            f"{time_of(f.st_ctime_ns)} sqbox {b.st_dev:x}:{b.st_ino:x} {time_of(b.st_mtime_ns)}"
            f" boot {Path('/proc/sys/kernel/random/boot_id').read_text()}"
            f" cgroups {Path('/proc/self/cgroup').read_text()}")


def peer_request(socket_path, user, identity):
    """As `user`: connects to the server's socket (if it may) and sends a request; returns what
    came back: 'refused to connect: ...', or how many descriptors the answer carried."""
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n"
        f"    s.connect({str(socket_path)!r})\n"
        "except OSError as e:\n"
        "    print('refused to connect:', e.strerror); sys.exit()\n"
        "s.settimeout(5)\n"
        "try:\n"
        f"    s.sendall(b'm' + {identity.encode()!r})\n"
        "    msg, fds, _, _ = socket.recv_fds(s, 4096, 4)\n"
        "except OSError as e:\n"
        "    msg, fds = b'', []\n"
        "print('descriptors:', len(fds))\n")
    result = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", script],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_another_user_gets_nothing_from_the_server(box, cache, tmp_path):
    pwd.getpwnam(UNPRIVILEGED_USER)
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert record["image_access"] == "shared", result.stderr
    [socket_path] = (cache / "image-servers").glob("*.socket")
    # The directory is private: the other user cannot even connect.
    os.chmod(cache, 0o755)
    identity = image_identity(box.busybox_image, box.binary)
    assert peer_request(socket_path, UNPRIVILEGED_USER, identity).startswith("refused to connect")
    # Opened up by mistake: the server still answers only its own user.
    os.chmod(cache / "image-servers", 0o777)
    os.chmod(socket_path, 0o777)
    assert peer_request(socket_path, "root", identity) == "descriptors: 1"  # the request is right
    assert peer_request(socket_path, UNPRIVILEGED_USER, identity) == "descriptors: 0"
    # And a directory that is not private is not used again: the next sandbox serves itself.
    again, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30,
                             options=["--verbose"])
    assert again.returncode == 0 and record["image_access"] == "fuse"
    assert "is not private to you" in again.stderr


def test_a_crash_of_the_shared_parser_ends_its_sandboxes_with_one_line(box, cache, tmp_path):
    connections_before = fuse_connections()
    env = environment(cache, idle=30)
    sandboxes = [subprocess.Popen(box.argv(box.python_image, ["sh", "-c", "echo ready; read x",
                                                              box.marker]),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        for sandbox in sandboxes:
            assert sandbox.stdout.readline() == "ready\n"
        [(server, [parser])] = shared_servers(cache)
        os.kill(parser, signal.SIGSEGV)
        for sandbox in sandboxes:
            sandbox.wait(timeout=SANDBOX_TIMEOUT + GRACE)
            stderr = sandbox.stderr.read()
            assert sandbox.returncode == 125, stderr
            assert stderr.splitlines() == ["sqbox: the image server died of signal 11 "
                                           "(Segmentation fault); the image may be corrupt; "
                                           "sandbox killed"], stderr
    finally:
        for sandbox in sandboxes:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
    assert wait_for(lambda: not Path(f"/proc/{server}").exists(), 10)
    # The next run starts a new server.
    result, record = run_json(box, cache, box.python_image, ["python3", "-c", "print(1)"],
                              tmp_path, idle=1)
    assert result.returncode == 0 and result.stdout == "1\n", result.stderr
    assert record["image_access"] == "shared"
    assert wait_for(lambda: shared_servers(cache) == [], 10)
    # The crashed server's connection goes once the last mount of it has (on a busy machine,
    # seconds after its sandboxes).
    assert new_fuse_connections(connections_before, wait=15.0) == []


def test_a_stalled_shared_server_holds_no_sandbox_past_its_end_or_timeout(box, cache, tmp_path):
    """A server that stops answering (a hostile image can make its parser spin) stalls only the
    requests waiting on it: of two sandboxes running when it stalls, the one whose payload ends
    without the image ends, the one that reads the image ends at its --timeout with 124."""
    env = environment(cache, idle=30)
    scripts = {"ends": "echo ready; read x; echo done",
               # Opens of files cached already ask the server nothing (zero-message opens):
               # a walk of every directory does, some of them never listed before.
               "reads": "echo ready; read x; find / -xdev > /dev/null 2>&1; echo done"}
    sandboxes = {name: subprocess.Popen(
        box.argv(box.busybox_image, ["sh", "-c", script, box.marker], options=["--timeout", "8"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env) for name, script in scripts.items()}
    parser = None
    try:
        for sandbox in sandboxes.values():
            assert sandbox.stdout.readline() == "ready\n"
        [(server, [parser])] = shared_servers(cache)
        os.kill(parser, signal.SIGSTOP)
        # sh's read and echo are builtins: "ends" asks the image nothing.
        stdout, stderr = sandboxes["ends"].communicate("go\n", timeout=GRACE)
        assert sandboxes["ends"].returncode == 0 and stdout == "done\n", stderr
        stdout, stderr = sandboxes["reads"].communicate("go\n", timeout=8 + GRACE)
        assert sandboxes["reads"].returncode == 124 and stdout == "", stderr
        assert stderr.splitlines() == ["sqbox: timed out after 8 s; sandbox killed"]
    finally:
        for sandbox in sandboxes.values():
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
        if parser is not None:
            os.kill(parser, signal.SIGCONT)
            os.kill(server, signal.SIGTERM)
            wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


def test_a_stalled_shared_server_makes_the_next_sandbox_serve_its_image_itself(
        box, cache, tmp_path):
    """A later sandbox of an image whose server has stalled does not wait on it past its
    --timeout: its launcher finds the mount not answering and serves it itself."""
    first, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
    assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
    [(server, [parser])] = shared_servers(cache)
    os.kill(parser, signal.SIGSTOP)
    try:
        result, record = run_json(box, cache, box.python_image, ["python3", "-c", "print(1)"],
                                  tmp_path, idle=30, options=["--timeout", "5"])
        assert result.returncode == 0 and result.stdout == "1\n", result.stderr
        assert record["image_access"] == "fuse"
    finally:
        os.kill(parser, signal.SIGCONT)
        os.kill(server, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


# Run by a payload given the cache directory (--mount ~:... is all it takes): it takes the
# server's socket name. "silent" listens and never accepts (a backlog of one, filled at once);
# "forged" answers every request with a descriptor of its own instead of the image's mount.
SQUATTER = r"""
import os, socket, sys
path, how = sys.argv[1], sys.argv[2]
os.unlink(path)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(path)
listener.listen(0)
if how == "silent":
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    filler.connect(path)
print("squatted", flush=True)
if how == "forged":
    forged = os.open("/", os.O_PATH)
    while True:
        connection, _ = listener.accept()
        connection.recv(4096)
        socket.send_fds(connection, [b"m"], [forged])
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["silent", "forged"])
def test_a_payload_that_takes_the_servers_socket_neither_hangs_nor_breaks_the_next_sandbox(
        box, cache, tmp_path, how):
    first, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
    [socket_path] = (cache / "image-servers").glob("*.socket")
    squatter = subprocess.Popen(
        box.argv(box.python_image, ["python3", "-c", SQUATTER,
                                    f"/cache/image-servers/{socket_path.name}", how, box.marker],
                 options=["--mount", f"{cache}:/cache", "--image-server-idle", "0",
                          "--timeout", "120"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(cache))
    try:
        assert squatter.stdout.readline() == "squatted\n", squatter.stderr.read()
        # The squatter outlives the wait: the run must end by itself, within its timeout.
        result, record = run_json(box, cache, box.busybox_image, ["echo", "ran"], tmp_path,
                                  idle=30, options=["--timeout", "5"], timeout=5 + GRACE)
        assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
        assert record["image_access"] == "fuse"
    finally:
        squatter.kill()
        squatter.wait()
        for server, _ in _image_servers({socket_path.name}):
            if server not in _EARLIER[cache]:
                os.kill(server, signal.SIGTERM)


def _job_cgroup(name):
    """A cgroup for one simulated batch job (Slurm's proctrack/cgroup gives each job one and
    kills every process in it when the job ends)."""
    root = Path("/sys/fs/cgroup")
    base = root if (root / "cgroup.controllers").exists() else root / "pids"
    path = base / name
    path.mkdir()
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make cgroups")
def test_the_end_of_one_job_ends_no_sandbox_of_another(box, cache, tmp_path):
    """Two jobs of the caller's on one node, each in a cgroup of its own that is killed when the
    job ends: the end of the job whose sandbox started the image's server ends no sandbox of the
    other job."""
    tag = f"sqbox-test-job-{os.getpid()}-{time.monotonic_ns()}"
    jobs = [_job_cgroup(f"{tag}-{n}") for n in ("first", "second")]
    env = environment(cache, idle=30)

    def in_job(job, argv, **kwargs):
        # The job's shell joins its cgroup, then runs sqbox as a batch script would.
        return subprocess.Popen(["sh", "-c", f'echo $$ > {job}/cgroup.procs && exec "$@"', "sh",
                                 *argv], env=env, text=True, **kwargs)

    second = None
    try:
        first = in_job(jobs[0], box.argv(box.busybox_image, ["true"]),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert first.wait(timeout=SANDBOX_TIMEOUT + GRACE) == 0, first.stderr.read()
        second = in_job(jobs[1], box.argv(box.busybox_image, [
            "sh", "-c", "echo ready; read x; md5sum /bin/busybox >/dev/null && echo done",
            box.marker]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert second.stdout.readline() == "ready\n", second.stderr.read()
        # The first job ends: everything left in its cgroup is killed.
        for pid in (jobs[0] / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(1)
        stdout, stderr = second.communicate("go\n", timeout=SANDBOX_TIMEOUT + GRACE)
        assert second.returncode == 0 and stdout == "done\n", stderr
    finally:
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
        for job in jobs:
            for pid in (job / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            wait_for(lambda: (job / "cgroup.procs").read_text() == "", 10)
            job.rmdir()


def test_a_server_killed_before_it_could_clean_up_is_swept_by_the_next_one(box, cache, tmp_path):
    """A server killed (its job's cgroup at the job's end) leaves its socket and lock; the next
    server started in the directory, of any image, removes them, and nothing of a live one."""
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(killed, kids)] = shared_servers(cache)
    left = sorted(p.name for p in (cache / "image-servers").iterdir())
    assert len(left) == 2, left  # its socket and lock
    for pid in (killed, *kids):
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in (killed, *kids)), 10)
    live = []
    try:
        # Another image's server starts: the killed one's files go.
        result, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
        assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
        python_files = sorted(p.name for p in (cache / "image-servers").iterdir())
        assert len(python_files) == 2 and not set(left) & set(python_files), (left, python_files)
        # The killed one's image gets a new server; the live one's files stay.
        result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
        assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
        live = shared_servers(cache)
        assert len(live) == 2, live
        names = sorted(p.name for p in (cache / "image-servers").iterdir())
        assert names == sorted(left + python_files), names
    finally:
        for server, _ in live:
            os.kill(server, signal.SIGTERM)


TRACING = Path("/sys/kernel/tracing")
FUSE_REQUEST_SENT = TRACING / "events" / "fuse" / "fuse_request_send"


@contextlib.contextmanager
def fuse_requests_traced():
    """Records the kernel's FUSE requests (its fuse:fuse_request_send tracepoint, system-wide) in
    a tracing instance of the test's own; yields a function that lists what was sent so far on
    one connection (its device number, as the tracepoint prints it): (sender's pid, kind)."""
    if os.geteuid() != 0:
        pytest.skip("the kernel's fuse tracepoints need root")
    if not FUSE_REQUEST_SENT.is_dir():
        pytest.skip(f"no fuse tracepoints at {FUSE_REQUEST_SENT} (tracefs not mounted, or a "
                    "kernel without CONFIG_FUSE_FS tracing)")
    instance = TRACING / "instances" / f"sqbox-test-{os.getpid()}"
    try:
        instance.mkdir()
    except OSError as e:  # a read-only tracefs (a container's)
        pytest.skip(f"cannot make a tracing instance in {TRACING}: {e.strerror}")
    try:
        (instance / "buffer_size_kb").write_text("4096")
        (instance / "events/fuse/fuse_request_send/enable").write_text("1")

        def sent(connection):
            requests = []
            for line in (instance / "trace").read_text().splitlines():
                found = re.search(r"-(\d+) +\[\d+\] .* fuse_request_send: connection (\d+) "
                                  r"req \d+ opcode \d+ \((\w+)\)", line)
                if found and int(found.group(2)) == connection:
                    requests.append((int(found.group(1)), found.group(3)))
            return requests

        yield sent
    finally:
        (instance / "events/fuse/fuse_request_send/enable").write_text("0")
        instance.rmdir()


def fuse_connection_of(pid):
    """The FUSE connection of the image mounted at /image for `pid`, numbered as the tracepoint
    numbers it (the superblock's device number, the kernel's encoding)."""
    [device] = [line.split()[2] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/image"]
    major, minor = (int(n) for n in device.split(":"))
    return major << 20 | minor


# Opens and reads files of the image: each open of a file was one OPEN and one RELEASE.
READ_FILES = "md5sum /bin/busybox /etc/passwd /etc/group; ls -l / /bin > /dev/null"


def test_later_sandboxes_open_the_images_files_without_a_fuse_request(box, cache, tmp_path):
    """The shared server's parser refuses OPEN (ENOSYS): the kernel then opens files of the
    connection with no request. Each close would send FLUSH until one is refused, so the server
    opens and closes one file itself before it hands out a mount: the connection's one FLUSH, and
    no close of anyone, the parser's read-ahead thread included, ever waits for an answer."""
    with fuse_requests_traced() as sent:
        first, record = run_json(box, cache, box.busybox_image, ["sh", "-c", READ_FILES],
                                 tmp_path, idle=30)
        assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
        [(server, [parser])] = shared_servers(cache)
        connection = fuse_connection_of(parser)
        first_requests = sent(connection)
        later, record = run_json(box, cache, box.busybox_image, ["sh", "-c", READ_FILES],
                                 tmp_path, idle=30)
        later_requests = sent(connection)[len(first_requests):]
    try:
        assert later.returncode == 0 and record["image_access"] == "shared", later.stderr
        assert later.stdout == first.stdout and "/bin/busybox" in later.stdout
        # The trace saw this connection: the first run looked names up and read the files.
        at_first = collections.Counter(kind for _, kind in first_requests)
        assert at_first["FUSE_LOOKUP"] > 0 and at_first["FUSE_READ"] > 0, at_first
        # Its only OPEN and FLUSH, the server's own (not its parser's, not a sandbox's), came
        # before any sandbox's request: the first request of a pid other than the server's
        # process and its parser is a later one.
        kinds_of = [(pid, kind) for pid, kind in first_requests
                    if kind in ("FUSE_OPEN", "FUSE_FLUSH", "FUSE_RELEASE")]
        assert kinds_of == [(server, "FUSE_OPEN"), (server, "FUSE_FLUSH")], kinds_of
        flushed = first_requests.index((server, "FUSE_FLUSH"))
        assert all(pid in (server, parser) for pid, _ in first_requests[:flushed]), first_requests
        # A later run, however many files it opens: at most three statfs (the launcher's check
        # that the mount answers, its overlayfs mount, the supervisor's check at the end).
        assert {kind for _, kind in later_requests} <= {"FUSE_STATFS"}, later_requests
        assert len(later_requests) <= 3, later_requests
    finally:
        os.kill(server, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


def ended(pid):
    """Gone, or a zombie: it has let go of its files and its FUSE connection (a process stuck in
    its exit, closing them, is not one yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_shared_parser_killed_while_its_first_sandbox_reads_always_ends(box, cache):
    """The parser killed at random times early in its life (while the server opens its first
    file, while the first sandbox starts Python and the parser reads ahead what it reads): had a
    close of a file of the image by its read-ahead thread waited for a FLUSH answer, its dying
    thread would wait for good, and the run with it (a narrow window, which the test above shows
    closed before any sandbox's request). Each run ends with the payload's output or with 125
    and sqbox's one line after the payload's own; the parser and its server end; the next run
    starts a new server."""
    rng = random.Random(24)
    argv = box.argv(box.python_image, ["python3", "-c", "import asyncio, decimal, email.mime.text, "
                                       "http.client, json, unittest; print('ran')", box.marker])
    env = environment(cache, idle=1)
    outcomes = collections.Counter()
    for _ in range(12):
        sandbox = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 10
            while [len(kids) for _, kids in shared_servers(cache)] != [1]:
                assert time.monotonic() < deadline, "no shared server came up"
                time.sleep(0.001)
            [(server, [parser])] = shared_servers(cache)
            time.sleep(rng.uniform(0, 0.06))
            os.kill(parser, signal.SIGKILL)
            stdout, stderr = sandbox.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
            if sandbox.returncode == 0:
                assert stdout == "ran\n" and stderr == "", stderr
            else:
                # After what the payload said of its lost files (a traceback, maybe cut short
                # mid-line), sqbox's one line.
                assert sandbox.returncode == 125, stderr
                assert stderr.endswith("sqbox: the image server died of signal 9 (Killed); the "
                                       "image may be corrupt; sandbox killed\n"), stderr
                assert stderr.count("sqbox: ") == 1, stderr
            assert wait_for(lambda: ended(server) and ended(parser), 10), (server, parser)
            outcomes[sandbox.returncode] += 1
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
    # Some kills came while a sandbox had the mount (which is where a wait for good would be).
    assert outcomes[125] > 0, outcomes

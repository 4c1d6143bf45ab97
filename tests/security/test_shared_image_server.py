"""The shared image server (SECURITY.md, "The shared image server"): one server per user and
image that outlives a sandbox, met at an abstract socket name in the caller's network namespace.
Each test ends the servers of its binary's images before and after it, so it starts the server it
looks at, and attacks a promise: sandboxes of an image share one mount and nothing one payload
does changes what the next sees; its parser is confined as a sandbox's own; no payload reaches
it; another user can neither get a mount from it nor have a forged one used; a crash ends its
sandboxes with one line; after the idle time nothing is left, on disk or in the namespace.
"""
import collections
import contextlib
import hashlib
import hmac
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
from host_processes import children, wait_for_a_fuse_request  # noqa: E402

UNPRIVILEGED_USER = "sqbox-test"


def stable_hash(data):
    """sqbox's stable_hash (util/stable_hash.h): FNV-1a, 64 bits."""
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) % 2**64
    return value


# The user's image server key (runtime/server_key.h) the cache fixture puts in each test's cache
# directory: one for every test and run of the suite, so that the servers an earlier test left are
# found by their names and ended. Attackers get it only where a test says so.
TEST_KEY = hashlib.sha256(b"the shared image server tests' key").digest()
KEY_FILE = "image-server.key"


def write_key(directory, key=TEST_KEY, user=None):
    """`key` as the key file of the cache `directory` (of `user`, if given)."""
    path = Path(directory) / KEY_FILE
    path.write_bytes(key)
    path.chmod(0o600)
    if user is not None:
        shutil.chown(path, user)
    return path


# runtime/server_key.cpp's key_proof, for the tests' own launchers, servers and attackers.
KEY_PROOF = r"""
import hashlib, hmac, os
def key_proof(key, role, identity, launcher_pid, challenge, own):
    parts = [b"sqbox launcher" if role == "launcher" else b"sqbox image server", identity,
             str(launcher_pid).encode(), challenge, own]
    message = b"".join(str(len(part)).encode() + b":" + part for part in parts)
    return hmac.new(key, message, hashlib.sha256).digest()

def pid_outside():
    # This process's pid as the server sees it: in a container of OTHER_CONTAINER's kind, /proc
    # is still the host's (an attacker's own server, started outside, numbers it so).
    return int(os.readlink("/proc/self"))

def own_mount(own_name, own_identity, own_key):
    # A copy of the mount of the attacker's own server (its key, its image): (connection, fds).
    import socket
    own = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    own.connect(b"\0" + own_name)
    servers = own.recv(4096)[1:]
    mine = os.urandom(32)
    own.sendall(b"m" + mine + key_proof(own_key, "launcher", own_identity, pid_outside(),
                                        servers, mine) + own_identity)
    _, fds, _, _ = socket.recv_fds(own, 4096, 4)
    return own, fds
"""
exec(KEY_PROOF)


def key_tag(key):
    """server_key_tag: a public tag of the key, in the server's name."""
    return key_proof(key, "server", b"the server's name", 0, b"", b"")[:8].hex()


def image_identity(image, binary, idle, cgroups=None):
    """The identity a launcher sends (runtime/shared_image.cpp, image_identity): anyone who can
    stat the image and the binary and read the caller's cgroups can make it."""
    f, b = os.stat(image), os.stat(os.path.realpath(binary))
    def time_of(ns):
        return f"{ns // 10**9}.{ns % 10**9}"
    # The sqbox it starts runs in this process's cgroups, unless told whose.
    if cgroups is None:
        cgroups = Path("/proc/self/cgroup").read_text()
    return (f"image {f.st_dev:x}:{f.st_ino:x} {f.st_size} {time_of(f.st_mtime_ns)} "
            f"{time_of(f.st_ctime_ns)} sqbox {b.st_dev:x}:{b.st_ino:x} {time_of(b.st_mtime_ns)}"
            f" idle {idle} cgroups {cgroups}")


def server_name(image, binary, idle, uid=None, cgroups=None, key=TEST_KEY):
    """The abstract socket name of `uid`'s server of `image` run by `binary` with an idle time
    of `idle` seconds and the key `key` (server_name in runtime/shared_image.cpp), without the
    leading NUL."""
    uid = os.geteuid() if uid is None else uid
    owned = f"uid {uid} key {key_tag(key)} {image_identity(image, binary, idle, cgroups)}"
    return f"sqbox-image-{stable_hash(owned.encode()):016x}"


def names_in_namespace():
    """The abstract socket names bound in this network namespace (/proc/net/unix shows them to
    everyone), without their '@'."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7].startswith("@"):
            names.add(fields[7][1:])
    return names


def _image_servers(names):
    """(server, its confined image server) of each running shared server whose name is one of
    `names`."""
    found = []
    shown = {f"@{name}".encode() for name in names}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            ppid = int(status_fields(entry)["PPid"])
        except (OSError, KeyError):
            continue
        if argv[1:3] == [b"image-server", b"--socket"] and argv[3] in shown:
            # The server and the confined parser it forked carry the same command line.
            if argv[:4] != _command_line(ppid)[:4]:
                found.append((int(entry), children(int(entry))))
    return found


def _command_line(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


# The idle times the tests ask for, and the default.
IDLE_TIMES = (1, 2, 30, 60)


def box_server_names(box):
    return {server_name(image, box.binary, idle) for image in (box.busybox_image, box.python_image)
            for idle in IDLE_TIMES}


def shared_servers(box):
    """(server, its confined image server) of each running shared server of the test's binary
    and images (the name holds both, and this user's uid and cgroups)."""
    return _image_servers(box_server_names(box))


def end_servers(box):
    """Ends the test binary's servers (an earlier test's, still in its idle time) and waits until
    their names are free."""
    servers = shared_servers(box)
    for server, _ in servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGTERM)
    names = box_server_names(box)
    assert wait_for(lambda: not names & names_in_namespace(), 15), names & names_in_namespace()


@pytest.fixture
def cache(box):
    """A cache directory of the test's own (with TEST_KEY as the user's key), and no server of the
    test's binary running before or after the test."""
    directory = Path(tempfile.mkdtemp(prefix="sqbox-image-servers-test-", dir="/tmp"))
    write_key(directory)
    end_servers(box)
    yield directory
    end_servers(box)
    shutil.rmtree(directory, ignore_errors=True)


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
    servers = shared_servers(box)
    assert len(servers) == 1 and len(servers[0][1]) == 1, servers
    name = server_name(box.busybox_image, box.binary, 2)
    assert name in names_in_namespace()
    if os.geteuid() == 0:
        # It holds no file of anyone's: its rendezvous is the abstract name, nothing on disk.
        held = [os.readlink(f"/proc/{servers[0][0]}/fd/{fd}")
                for fd in os.listdir(f"/proc/{servers[0][0]}/fd")]
        assert [h for h in held if h.startswith("/") and h not in (
            "/dev/null", os.path.realpath(box.busybox_image))] == [], held
        own_connection = str(fuse_connection_of(servers[0][1][0]))
        assert own_connection in (fuse_connections() or [own_connection])
    second, second_record = run_json(box, cache, box.busybox_image, ["md5sum", "/bin/busybox"],
                                     tmp_path, idle=2)
    assert second.returncode == 0 and second_record["image_access"] == "shared"
    assert shared_servers(box) == servers  # the same server, not a second one
    assert second.stdout == first.stdout
    # Idle for 2 s: the server, its parser, its name and its FUSE connection go, and nothing
    # was ever written for it (the cache holds no socket, lock or directory of servers).
    pids = [servers[0][0], *servers[0][1]]
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 15), pids
    assert name not in names_in_namespace()
    assert [p.name for p in cache.rglob("*")] == [KEY_FILE]  # the fixture's, and nothing else
    if os.geteuid() == 0:
        # Its own connection (other runs on the machine may make and hold connections meanwhile).
        assert wait_for(lambda: own_connection not in (fuse_connections() or []), 5)
    else:
        assert new_fuse_connections(connections_before) == []
    # --image-server-idle 0: a server of the sandbox's own, none left running.
    own, own_record = run_json(box, cache, box.busybox_image, ["true"], tmp_path,
                               options=["--image-server-idle", "0"])
    assert own.returncode == 0 and own_record["image_access"] == "fuse"
    assert shared_servers(box) == []


def test_the_shared_servers_parser_is_confined_like_a_sandboxs_own(box, cache, tmp_path):
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(server, [parser])] = shared_servers(box)
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
    assert len(shared_servers(box)) == 1  # all three shared it
    assert after.stdout == before.stdout == fresh.stdout


# Run by a payload: what it can see of the caller's network namespace and its server. It lists
# the named Unix sockets of its /proc/net/unix and the socket files it can find, tries to connect
# to the server's name, then binds that name itself (in its own namespace, where it is free) and
# answers whoever connects with a descriptor of its own instead of the image's mount.
PAYLOAD_PROBE = r"""
import errno, os, socket, stat, sys
name = b"\0" + sys.argv[1].encode()
named = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:]
         if len(line.split()) == 8]
print("named sockets:", named)
found = []
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if top != "/" or d not in ("proc", "sys", "dev")]
    found += [f for f in files if stat.S_ISSOCK(os.lstat(os.path.join(top, f)).st_mode)]
print("socket files:", found)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect(name)
    print("connect: connected")
except OSError as e:
    print("connect:", errno.errorcode[e.errno])
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(name)
listener.listen(8)
print("bound", flush=True)
forged = os.open("/", os.O_PATH)
listener.settimeout(1)
while True:
    try:
        connection, _ = listener.accept()
    except socket.timeout:
        continue
    print("a connection came", flush=True)
    socket.send_fds(connection, [b"m"], [forged])
"""


def test_a_payload_finds_no_way_to_the_server_and_cannot_take_its_name(box, cache, tmp_path):
    """Every sandbox has a network namespace of its own: the server's abstract name is not in
    it, nothing there answers to it, no socket file leads to it (the caller's cache mounted in
    holds none), and a payload that binds it there (and answers with a forged mount) is met by
    nobody: the next sandbox still gets the server's mount."""
    name = server_name(box.python_image, box.binary, 30)
    first, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
    assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
    prober = subprocess.Popen(
        box.argv(box.python_image, ["python3", "-c", PAYLOAD_PROBE, name, box.marker],
                 options=["--timeout", "60", "--mount", f"{cache}:/cache"]),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(cache, idle=30))
    try:
        lines = [prober.stdout.readline() for _ in range(4)]
        assert lines[3] == "bound\n", (lines, prober.stderr.read() if prober.poll() else "")
        assert lines[:3] == ["named sockets: []\n", "socket files: []\n",
                             "connect: ECONNREFUSED\n"], lines
        # While the payload holds the name in its namespace, the caller's next sandbox of the
        # image gets the real server's mount.
        after, record = run_json(box, cache, box.python_image,
                                 ["python3", "-c", "print(open('/etc/os-release').read())"],
                                 tmp_path, idle=30)
        assert after.returncode == 0 and record["image_access"] == "shared", after.stderr
        assert "ID=" in after.stdout
        assert name in names_in_namespace()
    finally:
        prober.kill()
        rest, _ = prober.communicate()
    assert "a connection came" not in rest


# A listening socket on an abstract name, for the attackers' scripts below that take the
# caller's server name: `said` goes to stdout once the name is theirs.
SQUAT = r"""
import socket


def squat(name, said="squatted"):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(b"\0" + name)
    listener.listen(8)
    print(said, flush=True)
    return listener
"""

# A launcher's request (runtime/shared_image.cpp, request_mount) with the key given in hex, or a
# key of its own if none: the server's challenge, then our challenge, our proof and the identity.
ASK = KEY_PROOF + r"""
import os, socket, sys
name, identity, key = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3]
key = bytes.fromhex(key) if key else os.urandom(32)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(5)
fds = []
try:
    s.connect(b"\0" + name)
    challenge = s.recv(4096)
    if challenge[:1] == b"n":
        own = os.urandom(32)
        proof = key_proof(key, "launcher", identity, pid_outside(), challenge[1:], own)
        s.sendall(b"m" + own + proof + identity)
        _, fds, _, _ = socket.recv_fds(s, 4096, 4)
except OSError:
    pass
print(len(fds))
"""


def ask_for_a_copy(name, identity, wrapper=(), key=None):
    """Connects to the server's abstract `name` from a process run under `wrapper` (another
    user, container, namespace) and asks with the right `identity`, proving `key` (a key of its
    own if None); returns how many descriptors the answer carried (0 too when nothing
    listens)."""
    asked = subprocess.run([*wrapper, sys.executable, "-c", ASK, name, identity,
                            key.hex() if key else ""], capture_output=True, text=True, timeout=30)
    assert asked.returncode == 0, asked.stderr
    return int(asked.stdout)


def peer_request(name, user, identity, in_user_namespace=False):
    """ask_for_a_copy as `user` (in a user namespace of its own where it is root, if asked), with
    the caller's key: only the uid tells it apart."""
    wrapper = ["runuser", "-u", user, "--"]
    if in_user_namespace:
        wrapper += ["unshare", "--user", "--map-root-user"]
    return f"descriptors: {ask_for_a_copy(name, identity, wrapper, key=TEST_KEY)}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_another_user_gets_nothing_from_the_server(box, cache, tmp_path):
    """Abstract names have no permissions: another user can connect. The server answers only
    its own user (SO_PEERCRED), whatever user namespace the other is root in, even one who has
    the user's key (which it could not read)."""
    pwd.getpwnam(UNPRIVILEGED_USER)
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert record["image_access"] == "shared", result.stderr
    name = server_name(box.busybox_image, box.binary, 30)
    identity = image_identity(box.busybox_image, box.binary, 30)
    assert peer_request(name, "root", identity) == "descriptors: 1"  # the request is right
    assert peer_request(name, UNPRIVILEGED_USER, identity) == "descriptors: 0"
    assert peer_request(name, UNPRIVILEGED_USER, identity, in_user_namespace=True) == \
        "descriptors: 0"
    # And it still serves its own user.
    again, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert again.returncode == 0 and record["image_access"] == "shared", again.stderr


# Run by another user, before the caller's first run of the image: it binds the server's
# abstract name. "bound" never listens; "full" listens and never accepts (a backlog of one,
# filled at once); "forged" accepts and answers every connection with a descriptor of its own
# instead of the image's mount, from a user namespace where it is root.
SQUATTER = r"""
import os, socket, sys
name, how = b"\0" + sys.argv[1].encode(), sys.argv[2]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(name)
if how != "bound":
    listener.listen(0)
if how == "full":
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    filler.connect(name)
print("squatted", flush=True)
if how == "forged":
    forged = os.open("/", os.O_PATH)
    while True:
        connection, _ = listener.accept()
        connection.settimeout(2)
        try:
            print("request bytes:", len(connection.recv(4096)), flush=True)
            socket.send_fds(connection, [b"m"], [forged])
        except OSError:
            pass
sys.stdin.read()
"""
SQUATTED_BECAUSE = {
    "bound": "is held by a socket that does not listen",
    "full": "stayed full for 1000 ms",
    "forged": "is held by a socket of uid {uid}",
}


def _as_user(user, argv):
    return argv if user == "root" else ["runuser", "-u", user, "--", *argv]


@pytest.fixture
def shared_tmp():
    """A directory in /tmp that another user can reach (pytest's own are root's, mode 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="sqbox-squat-test-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _user_directory(parent, user, name):
    directory = parent / name
    directory.mkdir()
    shutil.chown(directory, user, user)
    return directory


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
@pytest.mark.parametrize("victim,squatter", [("root", UNPRIVILEGED_USER),
                                            (UNPRIVILEGED_USER, "root")])
@pytest.mark.parametrize("how", ["bound", "full", "forged"])
def test_another_users_socket_on_the_name_costs_the_sharing_only(box, cache, shared_tmp, victim,
                                                                  squatter, how):
    """Another user binds the caller's server name first (anyone can compute it, or read it in
    /proc/net/unix once a server has run). The caller's run still works, serving its image
    itself, says why under -v, sends the squatter nothing and takes nothing from it; once the
    squatter lets go, the next run shares again."""
    binary = box.binary
    if victim != "root":  # the session's copy is below root's private directory
        binary = shared_tmp / "sqbox"
        shutil.copy(box.binary, binary)
    cgroups = subprocess.run(_as_user(victim, ["cat", "/proc/self/cgroup"]), capture_output=True,
                             text=True, check=True).stdout
    victim_uid = pwd.getpwnam(victim).pw_uid
    name = server_name(box.busybox_image, binary, 30, uid=victim_uid, cgroups=cgroups)
    victim_cache = _user_directory(shared_tmp, victim, "victim-cache")
    write_key(victim_cache, user=victim)
    records = _user_directory(shared_tmp, victim, "records")
    squatter_argv = [sys.executable, "-c", SQUATTER, name, how]
    if how == "forged" and squatter != "root":
        squatter_argv = ["unshare", "--user", "--map-root-user", *squatter_argv]
    # A session of its own: runuser's child outlives a kill of runuser, so the group is ended.
    holder = subprocess.Popen(_as_user(squatter, squatter_argv), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)

    def victim_run(record):
        argv = [binary, *box.argv(box.busybox_image, ["sh", "-c", "echo ran", box.marker],
                                  options=["--verbose", "--json", str(record), "--timeout",
                                           "5"])[1:]]
        result = subprocess.run(_as_user(victim, argv), capture_output=True, text=True,
                                timeout=5 + GRACE, env=environment(victim_cache, idle=30))
        return result, json.loads(record.read_text())

    try:
        assert holder.stdout.readline() == "squatted\n", holder.stderr.read()
        result, record = victim_run(records / "squatted.json")
        assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
        assert record["image_access"] == "fuse"
        because = SQUATTED_BECAUSE[how].format(uid=pwd.getpwnam(squatter).pw_uid)
        assert "sqbox: image: serving it alone: " in result.stderr, result.stderr
        assert because in result.stderr, result.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        rest, _ = holder.communicate()
    # The launcher sent the forged server nothing (it checked who listens before asking).
    assert [line for line in rest.splitlines() if line != "request bytes: 0"] == [], rest
    assert wait_for(lambda: name not in names_in_namespace(), 10)
    try:
        result, record = victim_run(records / "free.json")
        assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    finally:
        for server, _ in _image_servers({name}):
            os.kill(server, signal.SIGTERM)
        wait_for(lambda: name not in names_in_namespace(), 10)


def test_parallel_first_runs_start_exactly_one_server(box, cache, tmp_path):
    """The bind of the name is the lock: of launchers that find no server at once, one binds it
    and starts the server, the others connect to it; all share its mount."""
    for round_ in range(3):
        records = [tmp_path / f"round-{round_}-{n}.json" for n in range(6)]
        runs = [subprocess.Popen(box.argv(box.busybox_image, ["true", box.marker],
                                          options=["--json", str(record), "--verbose"]),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env=environment(cache, idle=30)) for record in records]
        for run in runs:
            _, stderr = run.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
            assert run.returncode == 0, stderr
            assert "serving it alone" not in stderr, stderr
        assert [json.loads(r.read_text())["image_access"] for r in records] == ["shared"] * 6
        servers = shared_servers(box)
        assert len(servers) == 1, servers
        end_servers(box)


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
        [(server, [parser])] = shared_servers(box)
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
    assert wait_for(lambda: shared_servers(box) == [], 10)
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
        [(server, [parser])] = shared_servers(box)
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


def test_a_sandbox_killed_behind_another_on_a_stalled_server_still_ends_at_its_timeout(
        box, cache, tmp_path):
    """A process whose look-up waits behind another's of the same name (the kernel makes one
    look-up of it at a time) cannot die until that one ends, whatever signal it gets; with the
    server stalled, that is never. So a sandbox still there a second after its --timeout's kill
    has its supervisor probe the mount: one that answers no statfs for 5 s has stalled, and the
    supervisor has the server end its parser. The sandbox then ends with 124, and the other, whose timeout
    is far off, with the usual line on the parser's death. Without that, the second would wait
    as long as the first, which with a stalled parser is until the first's timeout, if any."""
    env = environment(cache, idle=30)
    name = f"/never-looked-up-{os.getpid()}-{time.monotonic_ns()}"
    # `[` and `read` are the shell's builtins: the test of the name is the first look-up either
    # makes after the stall.
    script = f"echo ready; read x; [ -e {name} ]; echo done"
    # The first's own timeout, which would free the second too, comes long after the second's.
    first = subprocess.Popen(
        box.argv(box.busybox_image, ["sh", "-c", script, box.marker],
                 options=["--timeout", str(6 + 3 * GRACE)]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    second = subprocess.Popen(
        box.argv(box.busybox_image, ["sh", "-c", script, box.marker], options=["--timeout", "6"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    parser = None
    try:
        for sandbox in (first, second):
            assert sandbox.stdout.readline() == "ready\n"
        [(server, [parser])] = shared_servers(box)
        os.kill(parser, signal.SIGSTOP)
        first.stdin.write("go\n")
        first.stdin.flush()
        wait_for_a_fuse_request(first.pid, timeout=GRACE)  # its look-up of the name
        stdout, stderr = second.communicate("go\n", timeout=6 + GRACE)
        assert (second.returncode, stdout) == (124, ""), stderr
        assert stderr.splitlines() == ["sqbox: timed out after 6 s; sandbox killed"]
        stdout, stderr = first.communicate(timeout=GRACE)
        # Its look-up failed when the parser went; its supervisor may end it before the echo.
        assert first.returncode == 125 and stdout in ("", "done\n"), stderr
        assert [line.startswith("sqbox: the image server died") for line in
                stderr.splitlines()] == [True], stderr
        assert wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)
    finally:
        for sandbox in (first, second):
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
        if parser is not None and Path(f"/proc/{parser}").exists():
            os.kill(parser, signal.SIGCONT)
            os.kill(server, signal.SIGTERM)
            wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


def test_a_stalled_shared_server_makes_the_next_sandbox_serve_its_image_itself(
        box, cache, tmp_path):
    """A later sandbox of an image whose server has stalled does not wait on it past its
    --timeout: its launcher finds the mount not answering and serves it itself."""
    first, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
    assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
    [(server, [parser])] = shared_servers(box)
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


def test_a_server_that_never_answers_costs_no_sandbox_its_timeout(box, cache, tmp_path):
    """The launcher asks the server while the sandbox is being set up: a server that takes the
    request and never answers (stopped here) holds the launch for the launcher's wait, then the
    sandbox serves its image itself, and that wait does not count toward its --timeout."""
    first, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
    assert first.returncode == 0 and record["image_access"] == "shared", first.stderr
    [(server, [parser])] = shared_servers(box)
    os.kill(server, signal.SIGSTOP)
    try:
        # The launcher waits 10 s for an answer: more than the timeout.
        result, record = run_json(box, cache, box.python_image, ["python3", "-c", "print(1)"],
                                  tmp_path, idle=30, options=["--timeout", "4"])
        assert result.returncode == 0 and result.stdout == "1\n", result.stderr
        assert record["image_access"] == "fuse", record
    finally:
        os.kill(server, signal.SIGCONT)
        os.kill(server, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)


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


def test_a_killed_server_leaves_nothing_and_the_next_run_starts_another(box, cache, tmp_path):
    """A server killed before its idle time is up (its job's cgroup at the job's end): its name
    goes with its socket, there is nothing of it to clean, and the next run starts a new one."""
    name = server_name(box.busybox_image, box.binary, 30)
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(killed, kids)] = shared_servers(box)
    for pid in (killed, *kids):
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in (killed, *kids)), 10)
    assert name not in names_in_namespace()
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(server, _)] = shared_servers(box)
    assert server != killed
    assert [p.name for p in cache.rglob("*")] == [KEY_FILE]  # the fixture's, and nothing else


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
        [(server, [parser])] = shared_servers(box)
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
            while [len(kids) for _, kids in shared_servers(box)] != [1]:
                assert time.monotonic() < deadline, "no shared server came up"
                time.sleep(0.001)
            [(server, [parser])] = shared_servers(box)
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


# Run by a process of the caller's uid that shares the caller's network namespace (another
# container of a pod, a container on the host's network, or the host): it binds the caller's
# server name first and answers every launcher as a server would, handing it the mount of a server
# of its own for another image (the attacker's), which it gets with its own key. Its proof to the
# launcher is made with the caller's key if it is given one, else with its own.
RELAY = KEY_PROOF + SQUAT + r"""
import os, socket, struct, sys
victim_name, own_name, own_identity = (a.encode() for a in sys.argv[1:4])
own_key, victims_key = bytes.fromhex(sys.argv[4]), bytes.fromhex(sys.argv[5])
listener = squat(victim_name)
kept = []
while True:
    connection, _ = listener.accept()
    connection.settimeout(5)
    try:
        challenge = os.urandom(32)
        connection.sendall(b"n" + challenge)
        request = connection.recv(4096)
        launchers, identity = request[1:33], request[65:]
        print("request:", identity.decode(), flush=True)
        own, fds = own_mount(own_name, own_identity, own_key)
        launcher_pid = struct.unpack("3i", connection.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        proof = key_proof(victims_key or own_key, "server", identity, launcher_pid, launchers,
                          challenge)
        socket.send_fds(connection, [b"m" + proof], fds)
        kept += [connection, own]
    except OSError as e:
        print("relay failed:", e, flush=True)
"""

# The attacker's process: the caller's uid outside, root of a user namespace of its own, with
# its own mounts and pids; only the network namespace is the caller's.
OTHER_CONTAINER = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork"]


def start_attackers_server(box, tmp_path):
    """The attacker's own server, of its own image (the Python one), with a key of its own (its
    cache directory): its name, identity and key."""
    attackers_cache = tmp_path / "attackers-cache"
    attackers_cache.mkdir(mode=0o700)
    attackers_key = os.urandom(32)
    write_key(attackers_cache, attackers_key)
    result, record = run_json(box, attackers_cache, box.python_image, ["true"], tmp_path,
                              idle=30)
    assert record["image_access"] == "shared", result.stderr
    return (server_name(box.python_image, box.binary, 30, key=attackers_key),
            image_identity(box.python_image, box.binary, 30), attackers_key)


def test_another_container_of_the_callers_uid_neither_serves_nor_gets_the_image(
        box, cache, tmp_path):
    """A container that shares only the caller's network namespace, whose user is the caller's
    uid (pods run their containers as one uid, usually), in a pid namespace below the caller's
    (a container the caller's user starts on the host's network): SO_PEERCRED's uid and pid pass
    both ends' checks. It can ptrace none of the caller's processes and read none of the caller's
    files, so not the user's key. Still, it must neither have the caller's runs use a mount it
    hands out (the caller's sandbox would run the attacker's image, with whatever the caller
    mounts into it), nor get a copy of the caller's image's mount."""
    victim_name = server_name(box.busybox_image, box.binary, 30)
    identity = image_identity(box.busybox_image, box.binary, 30)
    own_name, own_identity, attackers_key = start_attackers_server(box, tmp_path)
    relay = subprocess.Popen([*OTHER_CONTAINER, sys.executable, "-c", RELAY, victim_name,
                              own_name, own_identity, attackers_key.hex(), ""],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert relay.stdout.readline() == "squatted\n", relay.stderr.read()
        probe = "test -e /usr/bin/python3 && echo attackers || echo callers"
        result, record = run_json(box, cache, box.busybox_image, ["sh", "-c", probe, box.marker],
                                  tmp_path, idle=30, options=["--verbose"])
        assert result.returncode == 0, result.stderr
        assert result.stdout == "callers\n", result.stderr
        assert record["image_access"] == "fuse"
        assert "proved no key of yours" in result.stderr, result.stderr
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relayed, _ = relay.communicate()
        for server, _ in _image_servers({own_name}):
            os.kill(server, signal.SIGTERM)
    # The launcher passed the uid and pid checks and asked: only the key stopped it.
    assert f"request: {identity}\n" in relayed, relayed
    # Once the name is free, the caller's own server runs; the other container asks it for a copy
    # with a key of its own, and gets none. (With the caller's key it would: nothing else tells
    # it from the caller.)
    assert wait_for(lambda: victim_name not in names_in_namespace(), 10)
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert record["image_access"] == "shared", result.stderr
    assert ask_for_a_copy(victim_name, identity, OTHER_CONTAINER) == 0
    assert ask_for_a_copy(victim_name, identity, OTHER_CONTAINER, key=TEST_KEY) == 1


# The caller as a container runs it: the caller's uid, a pid namespace of its own (the network
# namespace is the one the other processes of the test are in).
CALLERS_CONTAINER = ["unshare", "--user", "--map-current-user", "--pid", "--fork"]


def test_a_process_outside_the_callers_pid_namespace_neither_serves_nor_gets_the_image(
        box, cache, tmp_path):
    """The caller runs in a container (a pid namespace of its own); a process of the same uid
    outside it that shares the network namespace (another container of the pod, or the host)
    takes the name of the caller's server first and relays its own server's mount: the caller's
    sandbox serves its image itself and sees its own image. Then that process asks the caller's
    server, which runs in the caller's container, for a copy of its mount, and gets none. It has
    the caller's key (the host could read it): the pid check alone stops it."""
    victim_name = server_name(box.busybox_image, box.binary, 30)
    result, record = run_json(box, cache, box.python_image, ["true"], tmp_path, idle=30)
    assert record["image_access"] == "shared", result.stderr
    own_name = server_name(box.python_image, box.binary, 30)
    own_identity = image_identity(box.python_image, box.binary, 30)
    relay = subprocess.Popen([sys.executable, "-c", RELAY, victim_name, own_name, own_identity,
                              TEST_KEY.hex(), TEST_KEY.hex()],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    record_path = tmp_path / "victim.json"
    probe = "test -e /usr/bin/python3 && echo attackers || echo callers"
    victim = [*CALLERS_CONTAINER,
              *box.argv(box.busybox_image, ["sh", "-c", probe, box.marker],
                        ["--verbose", "--json", str(record_path)])]
    try:
        assert relay.stdout.readline() == "squatted\n", relay.stderr.read()
        result = subprocess.run(victim, capture_output=True, text=True,
                                env=environment(cache, idle=30), timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "callers\n", result.stderr
        assert json.loads(record_path.read_text())["image_access"] == "fuse"
        assert "outside your pid namespace" in result.stderr
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relay.communicate()
    assert wait_for(lambda: victim_name not in names_in_namespace(), 10)
    # The caller's own server, started from inside its container, and kept while it is asked.
    holder = subprocess.Popen(
        [*CALLERS_CONTAINER, *box.argv(box.busybox_image, ["sh", "-c", "echo up; read x",
                                                           box.marker])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(cache, idle=30))
    try:
        assert holder.stdout.readline() == "up\n", holder.stderr.read()
        assert victim_name in names_in_namespace()
        assert ask_for_a_copy(victim_name, image_identity(box.busybox_image, box.binary, 30),
                              key=TEST_KEY) == 0
    finally:
        holder.communicate(input="\n", timeout=60)


OVERFLOW_USER = "nobody"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")
def test_a_caller_whose_uid_is_the_overflow_uid_shares_with_no_other_user(box, shared_tmp):
    """The server's user namespace maps its caller's uid alone: every other user's connection
    shows there as the kernel's overflow uid (65534, nobody). A caller running as that uid (as
    pods and daemons often do) would take every other user for itself; it serves its images
    itself, and another user who asks with the right identity gets nothing."""
    overflow = int(Path("/proc/sys/kernel/overflowuid").read_text())
    assert pwd.getpwnam(OVERFLOW_USER).pw_uid == overflow
    pwd.getpwnam(UNPRIVILEGED_USER)
    binary = shared_tmp / "sqbox"  # the session's copy is below root's private directory
    shutil.copy(box.binary, binary)
    cgroups = subprocess.run(_as_user(OVERFLOW_USER, ["cat", "/proc/self/cgroup"]),
                             capture_output=True, text=True, check=True).stdout
    name = server_name(box.busybox_image, binary, 30, uid=overflow, cgroups=cgroups)
    identity = image_identity(box.busybox_image, binary, 30, cgroups)
    victim_cache, records = shared_tmp / "victim-cache", shared_tmp / "records"
    for directory in (victim_cache, records):
        directory.mkdir()
        shutil.chown(directory, OVERFLOW_USER)  # its group is not called as it is
    write_key(victim_cache, user=OVERFLOW_USER)
    record = records / "run.json"
    argv = [binary, *box.argv(box.busybox_image, ["sh", "-c", "echo ran", box.marker],
                              options=["--verbose", "--json", str(record)])[1:]]
    try:
        result = subprocess.run(_as_user(OVERFLOW_USER, argv), capture_output=True, text=True,
                                timeout=SANDBOX_TIMEOUT + GRACE,
                                env=environment(victim_cache, idle=30))
        assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
        assert ask_for_a_copy(name, identity, _as_user(UNPRIVILEGED_USER, [])) == 0
        assert json.loads(record.read_text())["image_access"] == "fuse"
        assert "is the kernel's overflow uid" in result.stderr, result.stderr
    finally:
        for server, _ in _image_servers({name}):
            os.kill(server, signal.SIGTERM)
        wait_for(lambda: name not in names_in_namespace(), 10)


def end_servers_named(names):
    for server, _ in _image_servers(names):
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGTERM)
    assert wait_for(lambda: not names & names_in_namespace(), 15)


def test_the_users_key_is_made_once_private_and_kept(box, tmp_path):
    """A cache directory without a key (a new user's): four first runs at once make one key, the
    user's alone (0600, 32 bytes, in a directory only the user can write), with nothing else left
    beside it; later runs keep using it, and meet the one server their key names."""
    fresh = tmp_path / "fresh-cache"
    runs = [subprocess.Popen(box.argv(box.busybox_image, ["true"],
                                      ["--json", str(tmp_path / f"first-{n}.json")]),
                             env=environment(fresh, idle=30), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for n in range(4)]
    names = set()
    try:
        for n, run in enumerate(runs):
            _, err = run.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
            assert run.returncode == 0, err
            record = json.loads((tmp_path / f"first-{n}.json").read_text())
            assert record["image_access"] == "shared", err
        key_file = fresh / KEY_FILE
        key = key_file.read_bytes()
        names = {server_name(box.busybox_image, box.binary, 30, key=key)}
        assert len(key) == 32 and key != TEST_KEY
        assert (key_file.stat().st_mode & 0o777, key_file.stat().st_uid) == (0o600, os.geteuid())
        assert fresh.stat().st_mode & 0o777 == 0o700
        assert [p.name for p in fresh.iterdir()] == [KEY_FILE]
        assert len(_image_servers(names)) == 1 and names <= names_in_namespace()
        result, record = run_json(box, fresh, box.busybox_image, ["true"], tmp_path, idle=30)
        assert record["image_access"] == "shared", result.stderr
        assert key_file.read_bytes() == key and len(_image_servers(names)) == 1
    finally:
        end_servers_named(names)


def test_a_cache_directory_linked_to_a_private_one_shares_its_key(box, tmp_path):
    """~/.cache/sqbox as a symlink to a directory elsewhere (a larger file system) that is the
    user's alone: the key is made there and the runs share their server, as with the directory
    itself; a link to a directory others can write is refused as that directory would be."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "linked-cache"
    link.symlink_to(target)
    names = set()
    try:
        result, record = run_json(box, link, box.busybox_image, ["true"], tmp_path, idle=30,
                                  options=["--verbose"])
        assert record["image_access"] == "shared", result.stderr
        key = (target / KEY_FILE).read_bytes()
        names = {server_name(box.busybox_image, box.binary, 30, key=key)}
        assert len(_image_servers(names)) == 1
        result, record = run_json(box, link, box.busybox_image, ["true"], tmp_path, idle=30)
        assert record["image_access"] == "shared", result.stderr
        assert len(_image_servers(names)) == 1
    finally:
        end_servers_named(names)
    target.chmod(0o777)
    result, record = run_json(box, link, box.busybox_image, ["true"], tmp_path, idle=30,
                              options=["--verbose"])
    assert record["image_access"] == "fuse"
    assert "must be a directory of yours that no one else can write" in result.stderr


def _readable_key(cache_dir):
    write_key(cache_dir).chmod(0o644)


def _short_key(cache_dir):
    write_key(cache_dir, TEST_KEY[:16])


def _linked_key(cache_dir):
    target = write_key(cache_dir).rename(cache_dir / "elsewhere")
    (cache_dir / KEY_FILE).symlink_to(target)


def _writable_directory(cache_dir):
    write_key(cache_dir)
    cache_dir.chmod(0o777)  # anyone could put a key of theirs there


@pytest.mark.parametrize("spoil,because", [
    (_readable_key, "must be a file of yours of 32 bytes that no one else can read or write"),
    (_short_key, "must be a file of yours of 32 bytes that no one else can read or write"),
    (_linked_key, "Too many levels of symbolic links"),
    (_writable_directory, "must be a directory of yours that no one else can write"),
])
def test_a_key_others_could_read_or_choose_is_not_used(box, cache, tmp_path, spoil, because):
    """A key another user could have read, or put there, proves nothing: the run serves its image
    itself, says why under -v, and leaves the file as it was (the user's to fix)."""
    spoiled = tmp_path / "spoiled-cache"
    spoiled.mkdir(mode=0o700)
    spoil(spoiled)
    before = {p.name: (p.lstat().st_mode, p.read_bytes()) for p in spoiled.iterdir()}
    result, record = run_json(box, spoiled, box.busybox_image, ["sh", "-c", "echo ran"],
                              tmp_path, idle=30, options=["--verbose"])
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    assert record["image_access"] == "fuse"
    assert "sqbox: image: serving it alone: " in result.stderr, result.stderr
    assert because in result.stderr, result.stderr
    assert {p.name: (p.lstat().st_mode, p.read_bytes()) for p in spoiled.iterdir()} == before
    assert shared_servers(box) == []


# Run by another container of the caller's uid (OTHER_CONTAINER): it takes the name of the
# caller's server while it is free, keeps the first launcher that connects, and lets the name go;
# the caller's next run starts the real server there. Then it passes messages between the two:
# the server's challenge to the launcher, the launcher's answer (its proof) to the server, and
# the server's answer back, keeping a copy of the mount it carries. With `own_name` it hands the
# launcher the mount of a server of its own instead (its own image), with the server's proof.
RELAY_BETWEEN = KEY_PROOF + SQUAT + r"""
import os, socket, sys, time
victim_name = sys.argv[1].encode()
own_name, own_identity = sys.argv[2].encode(), sys.argv[3].encode()
own_key = bytes.fromhex(sys.argv[4]) if sys.argv[4] else b""
listener = squat(victim_name)
launcher, _ = listener.accept()
listener.close()
print("released", flush=True)
deadline = time.monotonic() + 8
while True:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        server.connect(b"\0" + victim_name)
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            sys.exit("no server came")
        time.sleep(0.005)
server.settimeout(10)
launcher.settimeout(10)
launcher.sendall(server.recv(4096))      # the server's challenge
server.sendall(launcher.recv(4096))      # the launcher's proof
answer, fds, _, _ = socket.recv_fds(server, 4096, 4)
if fds:
    print("copy:", " ".join(sorted(os.listdir(f"/proc/self/fd/{fds[0]}"))), flush=True)
else:
    print("refused:", answer[1:].decode(errors="replace"), flush=True)
handed = fds
if own_key:
    own, handed = own_mount(own_name, own_identity, own_key)
socket.send_fds(launcher, [answer], handed) if handed else launcher.sendall(answer)
print("handed", flush=True)
launcher.settimeout(None)
launcher.recv(1)  # kept until the launcher ends
"""


@pytest.mark.parametrize("hands", ["the callers", "its own"])
def test_another_container_of_the_callers_uid_cannot_relay_the_callers_proofs(
        box, cache, tmp_path, hands):
    """Another container of the caller's uid, below the caller's pid namespace, without the key:
    it holds the name when a launcher of the caller connects, lets it go, and the caller's next run
    starts the real server there. Passing each end's messages to the other, it must get no copy of
    the caller's mount, and the launcher it holds must use no mount it hands over (the caller's
    own, or one of the attacker's choosing): the proofs bind the launcher that made them."""
    victim_name = server_name(box.busybox_image, box.binary, 30)
    own_name, own_identity, own_key = "", "", ""
    if hands == "its own":
        own_name, own_identity, attackers_key = start_attackers_server(box, tmp_path)
        own_key = attackers_key.hex()
    relay = subprocess.Popen([*OTHER_CONTAINER, sys.executable, "-c", RELAY_BETWEEN, victim_name,
                              own_name, own_identity, own_key],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    record_path = tmp_path / "held.json"
    probe = "test -e /usr/bin/python3 && echo attackers || echo callers"
    held = holder = None
    try:
        assert relay.stdout.readline() == "squatted\n", relay.stderr.read()
        held = subprocess.Popen(
            box.argv(box.busybox_image, ["sh", "-c", probe, box.marker],
                     ["--verbose", "--json", str(record_path)]),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(cache, idle=30))
        assert relay.stdout.readline() == "released\n", relay.stderr.read()
        # The caller's next run: it finds the name free and starts the real server.
        holder = subprocess.Popen(
            box.argv(box.busybox_image, ["sh", "-c", "echo up; read x", box.marker]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(cache, idle=30))
        assert holder.stdout.readline() == "up\n", holder.stderr.read()
        relayed = relay.stdout.readline()
        assert relayed.startswith("refused: "), relayed  # no copy of the caller's image
        stdout, stderr = held.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
        assert held.returncode == 0, stderr
        assert stdout == "callers\n", stderr
        assert json.loads(record_path.read_text())["image_access"] == "fuse", stderr
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relay.communicate()
        for process in (held, holder):
            if process is not None and process.poll() is None:
                with contextlib.suppress(OSError):
                    process.communicate(input="\n" if process is holder else None, timeout=60)
        if own_name:
            end_servers_named({own_name})


# A FUSE file system of one file, "f", that never answers a FLUSH (the request a close() of one
# of its files sends and waits for, deaf to SIGKILL): run as root of a user and mount namespace of
# its own (OTHER_CONTAINER), it mounts it (served by a child process, which holds /dev/fuse: when
# it is killed, the kernel ends what waits on the file system), opens "f", and passes that
# descriptor to a peer of the caller's uid. `role` "holder": it takes the caller's server name and
# greets each launcher with the descriptor (and a challenge one byte short, which the launcher
# refuses at once); "launcher": it asks the caller's running server, the descriptor with its
# request.
STALLED_FLUSH = SQUAT + r"""
import ctypes, os, socket, struct, sys, tempfile, time
role, name = sys.argv[1], sys.argv[2].encode()
fuse = os.open("/dev/fuse", os.O_RDWR)
mount_point = tempfile.mkdtemp()
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(b"stalled", mount_point.encode(), b"fuse", 0,
              f"fd={fuse},rootmode=40000,user_id=0,group_id=0".encode()) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))

def attr(node):
    mode = 0o40755 if node == 1 else 0o100644
    return struct.pack("<QQQQQQIIIIIIIIII", node, 0, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0,
                       4096, 0)

def serve():
    while True:
        request = os.read(fuse, 1 << 20)
        _, opcode, unique, node = struct.unpack_from("<IIQQ", request)
        error, out = 0, b""
        if opcode == 26:  # INIT
            out = struct.pack("<IIIIHHIIHHII6I", 7, 31, 0, 0, 0, 0, 4096, 1, 0, 0, 0, 0,
                              *[0] * 6)
        elif opcode == 3:  # GETATTR
            out = struct.pack("<QII", 0, 0, 0) + attr(node)
        elif opcode == 1:  # LOOKUP
            if request[40:].split(b"\0")[0] == b"f":
                out = struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2)
            else:
                error = -2
        elif opcode == 14:  # OPEN
            out = struct.pack("<QII", 1, 0, 0)
        elif opcode in (25, 2, 36):  # FLUSH: never answered; FORGET, INTERRUPT: not answered
            continue
        elif opcode != 18:  # RELEASE is answered; nothing else is implemented
            error = -38
        os.write(fuse, struct.pack("<IiQ", 16 + len(out), error, unique) + out)

if os.fork() == 0:
    serve()
os.close(fuse)
stalled = os.open(os.path.join(mount_point, "f"), os.O_RDONLY)
if role == "holder":
    listener = squat(name, "ready")
    kept = []
    while True:
        connection, _ = listener.accept()
        socket.send_fds(connection, [b"n" + os.urandom(31)], [stalled])  # one byte short
        kept.append(connection)
else:
    identity = sys.argv[3].encode()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.connect(b"\0" + name)
    server.recv(4096)
    socket.send_fds(server, [b"m" + os.urandom(64) + identity], [stalled])
    print("ready", flush=True)
    time.sleep(3600)
"""


def run_while(attacker, box, cache, tmp_path, options=()):
    """A run of the busybox image while `attacker` (the caller's uid, another container) does
    what it does: (its result, its JSON record). A run still going after its timeout and grace
    (a close() that never returns is deaf to SIGKILL) fails the test once the attacker is gone."""
    record = tmp_path / f"result-{time.monotonic_ns()}.json"
    run = subprocess.Popen(box.argv(box.busybox_image, ["sh", "-c", "echo ran", box.marker],
                                    ["--json", str(record), *options]),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=environment(cache, idle=30))
    try:
        stdout, stderr = run.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(attacker.pid, signal.SIGKILL)  # which lets the stalled close return
        run.kill()
        run.communicate()
        pytest.fail("the run did not end: it waits on the attacker's file system")
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr), \
        json.loads(record.read_text())


def test_a_descriptor_whose_close_never_returns_stalls_neither_end(box, cache, tmp_path):
    """Another container of the caller's uid (which passes the uid and pid checks) hands each end
    a descriptor of a file on a FUSE mount of its own that never answers the FLUSH a close()
    sends: the launcher in the challenge it greets it with while it holds the name, the server in
    a request. Neither may close it (a close() would wait for as long as that file system lives,
    deaf to SIGKILL): the launcher serves its image itself and ends, the server goes on serving."""
    name = server_name(box.busybox_image, box.binary, 30)
    identity = image_identity(box.busybox_image, box.binary, 30)
    holder = subprocess.Popen([*OTHER_CONTAINER, sys.executable, "-c", STALLED_FLUSH, "holder",
                               name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline() == "ready\n", holder.stderr.read()
        result, record = run_while(holder, box, cache, tmp_path, options=["--verbose"])
        assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
        assert record["image_access"] == "fuse"
        assert "unexpected greeting" in result.stderr, result.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.communicate()
    assert wait_for(lambda: name not in names_in_namespace(), 10)
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert record["image_access"] == "shared", result.stderr
    asker = subprocess.Popen([*OTHER_CONTAINER, sys.executable, "-c", STALLED_FLUSH, "launcher",
                              name, identity], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert asker.stdout.readline() == "ready\n", asker.stderr.read()
        result, record = run_while(asker, box, cache, tmp_path, options=["--verbose"])
        assert result.returncode == 0, result.stderr
        assert record["image_access"] == "shared", result.stderr
    finally:
        os.killpg(asker.pid, signal.SIGKILL)
        asker.communicate()


def memory_holds(pid, data):
    """Whether any readable mapping of `pid` holds `data` (read through /proc/PID/mem)."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split()
            if "r" not in fields[1] or fields[-1] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                continue
            start, end = (int(address, 16) for address in fields[0].split("-"))
            try:
                memory.seek(start)
                if data in memory.read(end - start):
                    return True
            except OSError:
                continue  # a mapping nothing backs any more
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read the confined parser's memory")
def test_the_shared_servers_parser_holds_no_copy_of_the_users_key(box, cache, tmp_path):
    """The shared server's parser reads images that may be hostile: one that took it over could
    serve whatever its memory holds as a file of the image to the payloads of its sandboxes,
    which can print it. The user's key must not be there (the server reads it only after it has
    forked the parser); the server, which checks proofs with it, holds it."""
    result, record = run_json(box, cache, box.busybox_image, ["true"], tmp_path, idle=30)
    assert result.returncode == 0 and record["image_access"] == "shared", result.stderr
    [(server, [parser])] = shared_servers(box)
    try:
        assert memory_holds(server, TEST_KEY)  # the search finds the key where it is
        assert not memory_holds(parser, TEST_KEY)
    finally:
        os.kill(server, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{parser}").exists(), 10)

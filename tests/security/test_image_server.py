"""The image server: the process that parses the image (libsquashfuse) for the sandbox.

A crafted image that takes the parser over must find nothing to use there. These tests look at
the running server from the outside (its /proc entries, as the host sees them) for every layer
SECURITY.md names, and feed sqbox corrupted images: each run ends cleanly (exit 0, or 125 with
one line), never hangs, and leaves nothing behind.
"""
import contextlib
import hashlib
import json
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from escape_support import GRACE, SANDBOX_TIMEOUT
import test_image_config as image_config  # for its inotify watch of a host file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

from host_mounts import fuse_connections, new_fuse_connections  # noqa: E402
from host_processes import children, cmdline, wait_for_a_fuse_request  # noqa: E402
from test_serve import Server  # noqa: E402

# RLIMIT_DATA of the server (runtime/image_server_confinement.h).
SERVER_DATA_LIMIT = 1 << 30
# A server of the sandbox's own, below its supervisor (test_shared_image_server.py has the
# shared one's tests).
OWN_SERVER = ["--image-server-idle", "0"]


def status_fields(pid):
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def find_image_server(launcher_pid):
    """The image server below the launcher (or sqbox serve): the supervisor's child that shares
    the supervisor's pid namespace (init is PID 1 of a new one, so its NSpid has two ids) and is
    under a seccomp filter of its own (serve's releaser of mount namespaces shares the pid
    namespace too, unconfined like the supervisor)."""
    supervisors = children(launcher_pid)
    assert len(supervisors) == 1, f"the launcher's children: {supervisors}"

    def nspid_depth(pid):
        try:
            return len(status_fields(pid)["NSpid"].split())
        except OSError:  # gone meanwhile
            return 0

    def confined(pid):
        try:
            return status_fields(pid)["Seccomp"] != "0"
        except OSError:  # gone meanwhile
            return False

    servers = [pid for pid in children(supervisors[0])
               if nspid_depth(pid) == 1 and confined(pid) and pid not in children(launcher_pid)]
    assert len(servers) == 1, f"the supervisor's children: {children(supervisors[0])}"
    return servers[0]


def mount_points(pid):
    """(mount point, filesystem type, mount options, superblock options) of pid's mounts."""
    mounts = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype, _, super_options = right.split()
        mounts.append((fields[4], fstype, fields[5].split(","), super_options.split(",")))
    return mounts


@contextlib.contextmanager
def running_image_server(box):
    """The image server (pid) of a sandbox of the Python image with a server of its own, while
    the sandbox waits; the sandbox must then end with 0."""
    sandbox = subprocess.Popen(box.argv(box.python_image, ["sh", "-c", "echo ready; read x; true",
                                                           box.marker], OWN_SERVER),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert sandbox.stdout.readline() == "ready\n", sandbox.stderr.read()
        yield find_image_server(sandbox.pid)
    finally:
        sandbox.stdin.close()
        sandbox.wait(timeout=SANDBOX_TIMEOUT + GRACE)
    assert sandbox.returncode == 0, sandbox.stderr.read()


def test_the_running_image_server_holds_nothing_a_parser_bug_could_use(box):
    with running_image_server(box) as server:
        # No capability in any set, no_new_privs, and seccomp in filter mode, in every thread
        # (the read-ahead thread included).
        tasks = os.listdir(f"/proc/{server}/task")
        assert len(tasks) >= 1
        for task in tasks:
            status = status_fields(f"{server}/task/{task}")
            for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert int(status[capability_set], 16) == 0, (task, capability_set, status)
            assert status["NoNewPrivs"] == "1", status
            assert status["Seccomp"] == "2", status

        # A memory limit, and no core dump.
        limits = {}
        for line in Path(f"/proc/{server}/limits").read_text().splitlines()[1:]:
            name = line[:26].strip()
            limits[name] = line[26:].split()[:2]
        assert limits["Max data size"] == [str(SERVER_DATA_LIMIT)] * 2, limits
        assert limits["Max core file size"] == ["0", "0"], limits
        # no thread flood, no file written
        assert limits["Max processes"] == ["1024", "1024"], limits
        assert limits["Max file size"] == ["0", "0"], limits

        # Its own file system: an empty read-only tmpfs as the root and its own FUSE mount;
        # no host path, no /oldroot.
        mounts = mount_points(server)
        assert [m[0] for m in mounts] == ["/", "/image"], mounts
        root, image = mounts
        assert root[1] == "tmpfs" and "ro" in root[2], root
        assert image[1] == "fuse.sqbox" and "ro" in image[2], image

        if os.geteuid() == 0:
            assert os.listdir(f"/proc/{server}/root") == ["image"]
            assert not os.path.exists(f"/proc/{server}/root/oldroot")
            # Its descriptors: /dev/null as stdio, the image, /dev/fuse, and what it opened
            # itself (files of its own mount to read ahead, splice pipes). Nothing of the
            # supervisor's: no report pipe, no socket, no cgroup file, no host directory.
            fds = {int(fd): os.readlink(f"/proc/{server}/fd/{fd}")
                   for fd in os.listdir(f"/proc/{server}/fd")}
            assert all(fds[fd].endswith("/dev/null") for fd in (0, 1, 2)), fds
            others = [target for fd, target in fds.items() if fd > 2]
            assert sum(target == box.python_image for target in others) == 1, fds
            assert sum(target.endswith("/dev/fuse") for target in others) == 1, fds
            for target in others:
                assert (target == box.python_image or target.endswith("/dev/fuse")
                        or target == "/image" or target.startswith("/image/")
                        or target.startswith("pipe:")), fds
        else:
            # Not dumpable: the caller's own account cannot look into it (nor ptrace it).
            with pytest.raises(PermissionError):
                os.listdir(f"/proc/{server}/fd")
            with pytest.raises(PermissionError):
                os.listdir(f"/proc/{server}/root")


PAGE = os.sysconf("SC_PAGE_SIZE")


def elf_layout(path):
    """(DT_FLAGS, DT_FLAGS_1, the (address, size) of the PT_GNU_RELRO segment or None, the
    (address, size) of each GOT section: .got, and .got.plt where lazy binding keeps one apart)
    of a 64-bit little-endian ELF file."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit LE ELF"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    relro = dynamic = None
    for index in range(phnum):
        kind, _, offset, address, _, size, memory_size = struct.unpack_from(
            "<IIQQQQQ", data, phoff + index * phentsize)
        if kind == 0x6474E552:  # PT_GNU_RELRO
            relro = (address, memory_size)
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, size)
    flags = flags_1 = 0
    assert dynamic is not None, "no dynamic segment"
    for entry in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, entry)
        if tag == 30:  # DT_FLAGS
            flags = value
        elif tag == 0x6FFFFFFB:  # DT_FLAGS_1
            flags_1 = value
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize)
                for index in range(shnum)]
    names_offset = sections[shstrndx][4]

    def name(section):
        start = names_offset + section[0]
        return data[start:data.index(b"\0", start)].decode()

    gots = [(section[3], section[5]) for section in sections
            if name(section) in (".got", ".got.plt")]
    return flags, flags_1, relro, gots


def test_the_image_servers_binary_has_every_symbol_bound_and_a_read_only_got(box):
    # SECURITY.md: a corrupted parser cannot redirect one of the binary's calls into libc by
    # overwriting its GOT.
    flags, flags_1, relro, gots = elf_layout(box.binary)
    assert flags & 0x8, f"DT_FLAGS {flags:#x} lacks DF_BIND_NOW"  # symbols bound at start
    assert flags_1 & 0x08000000, f"DT_FLAGS_1 {flags_1:#x} lacks DF_1_PIE"
    assert relro is not None, "no PT_GNU_RELRO segment"
    assert gots, "no GOT section"
    # ld.so makes the whole pages of that segment read-only once it has relocated: its start and
    # end rounded down to a page. Every GOT section must lie within.
    protected = (relro[0] // PAGE * PAGE, (relro[0] + relro[1]) // PAGE * PAGE)
    for address, size in gots:
        assert protected[0] <= address and address + size <= protected[1], (
            f"GOT {address:#x}+{size:#x} outside the read-only pages "
            f"{protected[0]:#x}-{protected[1]:#x}")
    if os.geteuid() != 0:
        return  # the server is not dumpable: only root reads its maps
    with running_image_server(box) as server:
        maps = [line.split(maxsplit=5)
                for line in Path(f"/proc/{server}/maps").read_text().splitlines()]
        binary = os.path.realpath(box.binary)
        # (low, high, permissions, file offset) of each mapping of the binary
        ours = [(*(int(end, 16) for end in m[0].split("-")), m[1], int(m[2], 16))
                for m in maps if len(m) == 6 and m[5] == binary]
        assert ours, f"no mapping of {binary} in the server"
        base = min(low for low, _, _, offset in ours if offset == 0)
        for address, size in gots:
            for page in range((base + address) // PAGE * PAGE, base + address + size, PAGE):
                holding = [perms for low, high, perms, _ in ours if low <= page < high]
                assert len(holding) == 1, (hex(page), ours)
                assert holding[0].startswith("r-"), f"the GOT's page {page:#x} is {holding[0]}"


def fuse_descriptors(task_path):
    """How many of a task's descriptors are /dev/fuse (its own table, /proc/PID/task/TID/fd)."""
    count = 0
    for fd in os.listdir(f"{task_path}/fd"):
        try:
            count += os.readlink(f"{task_path}/fd/{fd}").endswith("/dev/fuse")
        except FileNotFoundError:  # closed meanwhile
            pass
    return count


@pytest.mark.skipif(os.geteuid() != 0, reason="the image server is not dumpable: only root can "
                    "read its threads' descriptor tables")
def test_only_the_serving_thread_of_the_image_server_holds_dev_fuse(box):
    """The read-ahead thread opens files of the server's own mount, and each open is a request
    to the server; a thread waiting for an answer its server read but never gave cannot be
    killed. Were /dev/fuse in that thread's table too, a server killed meanwhile would never close
    it: the run would hang past its timeout, FUSE connection and all (seen 1 run in ~500 of
    test_sandboxes_whose_init_fails_at_once_always_end). So the thread has a table of its own
    with no /dev/fuse in it, and the serving thread's exit aborts the connection."""
    with running_image_server(box) as server:
        tasks = sorted(int(task) for task in os.listdir(f"/proc/{server}/task"))
        assert server in tasks and len(tasks) == 2, tasks  # serving thread and read-ahead thread
        held = {task: fuse_descriptors(f"/proc/{server}/task/{task}") for task in tasks}
        assert held[server] == 1, held
        assert all(count == 0 for task, count in held.items() if task != server), held


def squashfs_tables(data):
    """Offsets of the inode table, the directory table and what follows them."""
    inode_table, directory_table, fragment_table, lookup_table = struct.unpack_from(
        "<qqqq", data, 64)
    id_table = struct.unpack_from("<q", data, 48)[0]
    following = [t for t in (fragment_table, lookup_table, id_table) if t > directory_table]
    return inode_table, directory_table, min(following)


def busybox_tools(base, busybox_rootfs):
    """base/tools holding a static busybox, to mount into sandboxes of images that have none."""
    tools = base / "tools"
    tools.mkdir()
    shutil.copy(busybox_rootfs / "bin" / "busybox", tools / "busybox")
    for path in (tools, tools / "busybox"):
        path.chmod(0o755)
    return tools


@pytest.fixture(scope="module")
def small_image_and_tools(tmp_path_factory, busybox_rootfs):
    """An uncompressed image of a small tree (files of several sizes, symlinks, /etc of the
    busybox image), and a static busybox outside it to walk it with."""
    base = tmp_path_factory.mktemp("corrupted-images")
    base.chmod(0o755)
    tree = base / "tree"
    shutil.copytree(busybox_rootfs / "etc", tree / "etc", symlinks=True)
    rng = random.Random(7)
    for i in range(40):
        directory = tree / ["data", "data/a", "data/a/b", "lib"][i % 4]
        directory.mkdir(parents=True, exist_ok=True)
        size = rng.choice([10, 3000, 70000, 300000])
        (directory / f"f{i}").write_bytes(rng.randbytes(size))
        if i % 5 == 0:
            (directory / f"l{i}").symlink_to(f"f{i}")
    image = base / "base.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-noI", "-noD", "-noF", "-noX",
                    "-all-root", "-all-time", "0", "-mkfs-time", "0", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL, timeout=120)
    image.chmod(0o755)
    return image, busybox_tools(base, busybox_rootfs)


# Reads every file and lists every directory and symlink of the image, ignoring what fails:
# the payload itself always ends with 0, so any other status is sqbox's.
WALK = ("B=/tools/busybox; $B find / \\( -path /proc -o -path /dev -o -path /sys -o -path /tools"
        " \\) -prune -o -type f -exec $B cat {} + >/dev/null 2>&1; $B ls -lR / >/dev/null 2>&1;"
        " exit 0")


def corrupted_copies(image, seeds):
    """(seed, the image with 1 to 8 bytes of its inode or directory tables flipped) per seed."""
    data = image.read_bytes()
    inode_table, _, tables_end = squashfs_tables(data)
    for seed in seeds:
        rng = random.Random(seed)
        corrupted = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            corrupted[rng.randrange(inode_table, tables_end)] ^= rng.randint(1, 255)
        yield seed, corrupted


def test_corrupted_images_end_in_one_line_never_a_hang(box, small_image_and_tools, tmp_path):
    base_image, tools = small_image_and_tools
    connections_before = fuse_connections()
    outcomes = {}
    for seed, corrupted in corrupted_copies(base_image, range(60)):
        image = tmp_path / f"corrupted-{seed}.sqsh"
        image.write_bytes(corrupted)
        image.chmod(0o644)
        # Each image gets a shared server of its own, gone a second after its sandbox.
        result = box.run(str(image), "/tools/busybox", "sh", "-c", WALK, box.marker,
                         options=["--mount", f"{tools}:/tools:ro", "--image-server-idle", "1"])
        lines = result.stderr.splitlines()
        if result.returncode == 0:
            assert lines == [], (seed, result.stderr)
        else:
            assert result.returncode == 125, (seed, result.returncode, result.stderr)
            assert len(lines) == 1 and lines[0].startswith("sqbox: "), (seed, result.stderr)
        outcomes.setdefault(result.returncode, []).append(lines[0] if lines else "")
        image.unlink()
    # The flips reached the parser: some runs found the image broken. None crashed the server:
    # sqbox's checks around libsquashfuse (image/squashfs_guards.h) answer EIO instead.
    assert 125 in outcomes and 0 in outcomes, outcomes
    assert not any("the image server died" in line for line in outcomes[125]), outcomes
    assert new_fuse_connections(connections_before) == []


def test_corrupted_gzip_blocks_fail_their_reads_never_cut_a_file_short(box, busybox_rootfs,
                                                                       tmp_path):
    """An image made with mksquashfs's defaults (gzip, whose blocks sqbox decodes with libdeflate:
    image/block_decoders.h) with bytes of its compressed data and fragment blocks flipped. A file
    whose block fails to decode fails to read (EIO), never as a shorter file (a short reply is the
    end of the file to the kernel); the server lives on and the run ends with the payload's 0 (or
    with 125 and one line if sqbox's own read of the image's /etc failed). Most damaged files
    fail; a few may read as other bytes (Adler-32 is weak, and squashfs has no checksums)."""
    tree = tmp_path / "tree"
    shutil.copytree(busybox_rootfs / "etc", tree / "etc", symlinks=True)
    rng = random.Random(11)
    files = {}
    for i in range(24):
        # Text that compresses (a block that would not is stored raw, with no checksum to fail),
        # in files of several blocks, of one, and in fragments.
        words = [f"{rng.randrange(1 << 20):x}" for _ in range(200)]
        size = rng.choice([700, 5000, 90000, 400000])
        data = " ".join(rng.choice(words) for _ in range(size // 4)).encode()[:size]
        (tree / "data").mkdir(exist_ok=True)
        (tree / "data" / f"f{i}").write_bytes(data)
        files[f"/data/f{i}"] = (len(data), hashlib.sha256(data).hexdigest())
    image = tmp_path / "gzip.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL, timeout=120)
    tmp_path.chmod(0o755)
    tools = busybox_tools(tmp_path, busybox_rootfs)
    data = image.read_bytes()
    inode_table, _, _ = squashfs_tables(data)
    # Per file: its size as read and its digest, or "failed".
    walk = ("B=/tools/busybox; for f in " + " ".join(sorted(files)) +
            "; do n=$($B cat $f 2>/dev/null | $B wc -c) && $B cat $f >/dev/null 2>&1 &&"
            " echo \"$n $($B sha256sum $f | $B cut -d' ' -f1) $f\" || echo \"failed $f\";"
            " done; exit 0")
    connections_before = fuse_connections()
    failed = wrong = 0
    for seed in range(12):
        rng = random.Random(seed)
        corrupted = bytearray(data)
        # The data and fragment blocks lie between the 96-byte superblock and the inode table.
        for _ in range(rng.randint(1, 4)):
            corrupted[rng.randrange(96, inode_table)] ^= rng.randint(1, 255)
        copy = tmp_path / f"corrupted-{seed}.sqsh"
        copy.write_bytes(corrupted)
        copy.chmod(0o644)
        result = box.run(str(copy), "/tools/busybox", "sh", "-c", walk, box.marker,
                         options=["--mount", f"{tools}:/tools:ro", *OWN_SERVER])
        copy.unlink()
        if result.returncode != 0:
            # A damaged block of a file sqbox reads itself (the image's /etc/passwd) ends the run
            # before the payload, in one line.
            lines = result.stderr.splitlines()
            assert result.returncode == 125 and len(lines) == 1, (seed, result.stderr)
            assert "Input/output error" in lines[0], (seed, result.stderr)
            continue
        assert result.stderr == "", (seed, result.stderr)
        lines = result.stdout.splitlines()
        assert len(lines) == len(files), (seed, result.stdout)
        for line in lines:
            if line.startswith("failed "):
                failed += 1
                continue
            size, digest, path = line.split()
            assert int(size) == files[path][0], (seed, path, size)  # never cut short
            wrong += digest != files[path][1]
    # The flips reached the decoder, which refused most of what they broke.
    assert failed > 0 and wrong < failed, (failed, wrong)
    assert new_fuse_connections(connections_before) == []


def test_a_crashed_image_server_ends_its_sandbox_with_one_line(box):
    """What a parser crash the checks miss would do under sqbox run: the sandbox ends with 125 and
    one line naming the cause, and nothing is left (the autouse fixture checks processes)."""
    connections_before = fuse_connections()
    # The payload waits in a builtin (`read` of a pipe never written): nothing of it needs the
    # image once the server is gone, so the one line is sqbox's, not the shell's.
    sandbox = subprocess.Popen(box.argv(box.python_image, ["sh", "-c", "echo ready; read x",
                                                           box.marker], OWN_SERVER),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert sandbox.stdout.readline() == "ready\n"
        os.kill(find_image_server(sandbox.pid), signal.SIGSEGV)
        sandbox.wait(timeout=SANDBOX_TIMEOUT + GRACE)
        stderr = sandbox.stderr.read()
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()
    assert sandbox.returncode == 125, stderr
    assert stderr.splitlines() == ["sqbox: the image server died of signal 11 (Segmentation "
                                   "fault); the image may be corrupt; sandbox killed"], stderr
    assert new_fuse_connections(connections_before) == []


def test_sandboxes_whose_init_fails_at_once_always_end(box, busybox_rootfs, tmp_path):
    """An image whose /etc is a symlink makes init fail as soon as it builds the root, while the
    image server may still be reading ahead files it opened on its own mount. The server is then
    killed; had it a close of such a file waiting for its own answer (FUSE's FLUSH), it would never
    exit and the run would hang past any timeout (seen 1 run in ~20, 4 at a time). 40 runs, 4 at a
    time: each ends with 125 and sqbox's one line."""
    rootfs = tmp_path / "rootfs"
    shutil.copytree(busybox_rootfs, rootfs, symlinks=True)
    shutil.rmtree(rootfs / "etc")
    (rootfs / "etc").symlink_to("/nowhere")
    image = tmp_path / "image.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-quiet", "-no-progress"], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    argv = box.argv(str(image), ["sh", "-c", "cat /etc/passwd; echo ran", box.marker],
                    ["--timeout", "20", *OWN_SERVER])
    for _ in range(10):
        runs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(4)]
        try:
            for run in runs:
                _, stderr = run.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
                assert run.returncode == 125, stderr
                assert stderr.splitlines() == [
                    "sqbox: /etc: /etc is a symlink in the sandbox; refusing to follow it"], stderr
        finally:
            for run in runs:
                if run.poll() is None:
                    run.kill()
                    run.wait()


def pooled_sandbox_is_ready(server_pid):
    """Whether sqbox serve holds a pooled sandbox whose root is complete: an init (PID 1 of a
    pid namespace of its own) whose mount namespace has its overlay root and /proc."""
    for supervisor in children(server_pid):
        for pid in children(supervisor):
            try:
                if len(status_fields(pid)["NSpid"].split()) != 2:
                    continue
                mounts = [line.partition(" - ")
                          for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
            except (OSError, KeyError):  # gone meanwhile
                continue
            points = {(left.split()[4], right.split()[0]) for left, _, right in mounts}
            if ("/", "overlay") in points and ("/proc", "proc") in points:
                return True
    return False


def cache_reclaims():
    """The kernel's counts of what it has taken back from its caches since boot: pages reclaimed,
    slab objects scanned by shrinkers (dentries and inodes among them), and drops asked for
    through /proc/sys/vm/drop_caches (a node's tooling may write it)."""
    counts = {}
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(("pgsteal_", "drop_")) or name == "slabs_scanned":
            counts[name] = int(value)
    return counts


def run_with_image_server_stopped(sqbox_bin, python_image):
    """One sqbox serve --pool 1: a first run reads what Python's start reads, then a second starts
    Python in the pooled sandbox while the image server is stopped. (answer, whether the kernel
    took anything back from its caches meanwhile)."""
    server = subprocess.Popen([sqbox_bin, "serve", "--pool", "1", python_image],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    run = {"op": "run", "code": "import json; print(json.dumps(6 * 7))", "timeout": 20}
    image_server = None
    try:
        server.stdin.write(json.dumps(dict(run, id=1)) + "\n")
        server.stdin.flush()
        assert json.loads(server.stdout.readline())["stdout"] == "42\n"
        deadline = time.monotonic() + 20
        while not pooled_sandbox_is_ready(server.pid):
            assert time.monotonic() < deadline, "no pooled sandbox after the first run"
            time.sleep(0.05)
        reclaims_before = cache_reclaims()
        image_server = find_image_server(server.pid)
        os.kill(image_server, signal.SIGSTOP)
        server.stdin.write(json.dumps(dict(run, id=2)) + "\n")
        server.stdin.flush()
        # A process stuck on a lookup the stopped server has not read may keep the sandbox from
        # ending at its timeout: the answer is awaited with the server running again.
        if not select.select([server.stdout], [], [], run["timeout"] + GRACE)[0]:
            os.kill(image_server, signal.SIGCONT)
        answer = json.loads(server.stdout.readline())
        reclaimed = cache_reclaims() != reclaims_before
    finally:
        if image_server is not None:
            os.kill(image_server, signal.SIGCONT)
        server.stdin.close()
        server.wait(timeout=SANDBOX_TIMEOUT + GRACE)
    assert server.returncode == 0 and server.stderr.read() == ""
    return answer, reclaimed


def test_under_serve_files_of_the_image_open_without_asking_its_server(sqbox_bin, python_image):
    """sqbox serve's image server opens files with no message (no OPEN, RELEASE or FLUSH: a round
    trip less for each file a payload opens, docs/serve.md): once a run has read what Python's
    start reads, a pooled sandbox starts Python again with the image server stopped, from what
    the kernel keeps. With a round trip per open, the run would wait for the server, and time
    out. What the kernel keeps it may also drop (memory pressure, or drop_caches written by the
    node's tooling): a second run that waited while /proc/vmstat shows the kernel taking back
    from its caches proves nothing either way, and is tried again, at most three times."""
    attempts = []
    for _ in range(3):
        answer, reclaimed = run_with_image_server_stopped(sqbox_bin, python_image)
        attempts.append((answer, reclaimed))
        if (answer["exit_code"], answer["timed_out"], answer["stdout"]) == (0, False, "42\n"):
            return
        assert reclaimed, ("the second run waited for the stopped image server, and the kernel "
                           f"had dropped nothing from its caches: {answer}")
    pytest.fail(f"the kernel took back from its caches during each of three tries: {attempts}")


def test_under_serve_a_sandbox_killed_behind_another_on_a_stalled_server_still_ends(
        sqbox_bin, python_image):
    """Under sqbox serve, as under sqbox run (test_shared_image_server.py): a run whose look-up
    waits behind another run's of the same name cannot die while the image server is stalled.
    A second after its timeout's kill the supervisor probes the mount; one that answers no
    statfs for 5 s has stalled, and the supervisor ends the server and starts another, which
    answers the other run's look-up: that run ends as usual, and the killed one with its
    timeout."""
    # No pool: no sandbox is being set up beside the two runs when the server stops.
    server = Server(sqbox_bin, python_image, "--pool", "0")
    name = f"/never-looked-up-{os.getpid()}-{time.monotonic_ns()}"
    code = ("import os, time; print('ready', flush=True); time.sleep({}); "
            f"print(os.path.exists({name!r}))")
    # The first looks the name up 3 s after its start (the test sees it wait on FUSE), the second
    # 6 s after its own, 8 s before its timeout.
    runs = ((1, 3, 6 + 3 * GRACE), (2, 6, 14))
    image_server = None
    try:
        for run_id, pause, timeout in runs:
            server.send({"op": "run", "id": run_id, "stream": True, "code": code.format(pause),
                         "timeout": timeout})
        deadline = time.monotonic() + SANDBOX_TIMEOUT
        with server.cond:
            # Both have started Python (and read what its start reads) before the server stops.
            while {e["id"] for e in server.events if e.get("data") == "ready\n"} != {1, 2}:
                assert time.monotonic() < deadline, f"not both ready: {server.events}"
                server.cond.wait(deadline - time.monotonic())
        image_server = find_image_server(server.proc.pid)
        os.kill(image_server, signal.SIGSTOP)
        waiting = wait_for_a_fuse_request(server.proc.pid, timeout=GRACE)
        assert "python3" in cmdline(waiting)
        killed = server.wait(2, timeout=14 + GRACE)
        assert (killed["exit_code"], killed["timed_out"]) == (124, True), killed
        other = server.wait(1, timeout=GRACE)
        assert (other["exit_code"], other["stdout"]) == (0, "ready\nFalse\n"), other
    finally:
        if image_server is not None and Path(f"/proc/{image_server}").exists():
            os.kill(image_server, signal.SIGCONT)
        server.close()
    assert server.proc.returncode == 0
    assert [line.startswith("sqbox: the image server died") and "started another" in line
            for line in server.stderr] == [True], server.stderr


def serve_until_closed(sqbox_bin, image):
    """sqbox serve of `image`, its stdin closed at once: (status, stderr lines)."""
    server = subprocess.run([sqbox_bin, "serve", str(image)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=SANDBOX_TIMEOUT + GRACE)
    return server.returncode, server.stderr.splitlines()


def test_under_serve_an_image_without_files_near_its_root_is_refused_in_one_line(sqbox_bin,
                                                                                tmp_path):
    """Before its first sandbox sqbox serve opens and closes one regular file near the image's
    root (docs/serve.md): without one it refuses the image, and leaves nothing."""
    tree = tmp_path / "tree"
    (tree / "a" / "b" / "c").mkdir(parents=True)
    (tree / "link").symlink_to("a")
    image = tmp_path / "nofiles.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-noappend", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    connections_before = fuse_connections()
    assert serve_until_closed(sqbox_bin, image) == (125, [
        "sqbox: the sandbox supervisor failed to start: image: found no regular file near the "
        "image's root to open first"])
    assert new_fuse_connections(connections_before) == []


@pytest.mark.parametrize("through_oldroot", [True, False], ids=["oldroot", "absolute"])
def test_under_serve_the_first_close_opens_no_host_file_an_image_points_at(
        sqbox_bin, busybox_rootfs, host_sentinel, tmp_path, through_oldroot):
    """The first close before sqbox serve's first sandbox tries the image's /etc/passwd first
    (docs/serve.md). A hostile image makes it a symlink to a host file, absolute or through
    /oldroot (where the supervisor's child sees the host's root): it is passed over, another file
    of the image is closed instead, and the host file is never even opened."""
    rootfs = tmp_path / "rootfs"
    shutil.copytree(busybox_rootfs, rootfs, symlinks=True)
    (rootfs / "etc" / "passwd").unlink(missing_ok=True)
    prefix = "/oldroot" if through_oldroot else ""
    os.symlink(prefix + str(host_sentinel.file), rootfs / "etc" / "passwd")
    image = tmp_path / "passwd-elsewhere.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-noappend", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    watch = image_config._OpenWatch(host_sentinel.file)  # noqa: SLF001 (the test module's helper)
    assert serve_until_closed(sqbox_bin, image) == (0, [])
    assert not watch.touched()


def test_under_serve_corrupted_images_end_in_one_line_never_a_hang(sqbox_bin, small_image_and_tools,
                                                                  tmp_path):
    """The walk sqbox serve makes before its first sandbox reads the image's directories: on a
    corrupted one it starts, or ends with one line; it never waits for good, nor leaves a FUSE
    connection."""
    base_image, _ = small_image_and_tools
    connections_before = fuse_connections()
    outcomes = {}
    for seed, corrupted in corrupted_copies(base_image, range(1000, 1030)):
        image = tmp_path / f"corrupted-{seed}.sqsh"
        image.write_bytes(corrupted)
        status, lines = serve_until_closed(sqbox_bin, image)
        assert (status, lines) == (0, []) or (status == 125 and len(lines) == 1
                                              and lines[0].startswith("sqbox: ")), (seed, lines)
        outcomes.setdefault(status, []).append(lines)
        image.unlink()
    assert 0 in outcomes, outcomes
    assert new_fuse_connections(connections_before) == []


def test_under_serve_a_crashed_image_server_is_replaced_and_sessions_go_on(sqbox_bin,
                                                                         python_image, marker):
    server = subprocess.Popen([sqbox_bin, "serve", "--env", f"MARKER={marker}", python_image], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ask(request):
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        while True:
            line = server.stdout.readline()
            assert line, server.stderr.read()
            answer = json.loads(line)
            if answer.get("id") == request["id"] and "ok" in answer:
                return answer

    try:
        assert ask({"id": 1, "op": "session_open"})["ok"]
        assert ask({"id": 2, "op": "exec", "session": "s1", "code": "x = 41\nx + 1"})["value"] == "42"
        image_server = find_image_server(server.pid)
        # What a parser crash does to it (the server runs as the caller: the caller may signal it).
        os.kill(image_server, signal.SIGSEGV)
        # The session lives on, and reads files it never read before through the new server.
        answer = ask({"id": 3, "op": "exec", "session": "s1",
                      "code": "import decimal, fractions, statistics\nx + 2"})
        assert answer["ok"] and answer["error"] is None and answer["value"] == "43", answer
        answer = ask({"id": 4, "op": "run", "code": "print(6 * 7)"})
        assert answer["ok"] and answer["stdout"] == "42\n", answer
        replacement = find_image_server(server.pid)
        assert replacement != image_server
        assert status_fields(replacement)["Seccomp"] == "2"
    finally:
        server.stdin.close()
        server.wait(timeout=SANDBOX_TIMEOUT + GRACE)
    lines = server.stderr.read().splitlines()
    assert lines == ["sqbox: the image server died of signal 11 (Segmentation fault); the image may "
                     "be corrupt; started another (the request it was answering failed with EIO)"]
    assert server.returncode == 0

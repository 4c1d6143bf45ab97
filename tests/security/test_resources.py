"""Exhausting the host: processes, memory, disk, output. Each bomb must end (by the limit or the
timeout) with the host still able to work and nothing left behind."""
import json
import os
import subprocess
import time

import pytest

from escape_support import parse_results
from host_processes import wait_until_gone, wait_until_pid_namespace_is_empty

MiB = 1 << 20


def test_fork_bomb_is_contained(box, marker, tmp_path):
    """Forks until refused, then waits for the timeout. The bomb bounds itself at 600 processes:
    where the default of 512 is an RLIMIT_NPROC and sqbox runs as host root, the kernel does not
    apply it."""
    bound = 600
    record = tmp_path / "r.json"
    start = time.monotonic()
    result = box.py("""
        import time
        forked, error = 0, None
        try:
            while forked < int(sys.argv[2]):
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                forked += 1
        except OSError as e:
            error = ename(e.errno)
        finish(forked=forked, error=error, pidns=os.readlink("/proc/self/ns/pid"))
        time.sleep(60)
    """, bound, options=["--timeout", "4", "--json", str(record)], timeout=60)
    elapsed = time.monotonic() - start
    res = parse_results(result.stdout)
    assert result.returncode == 124, result
    assert elapsed < 30
    assert res is not None, result
    pids = json.loads(record.read_text())["limits"]["pids"]
    assert pids["value"] == 512, pids
    if pids["enforced_by"] == "rlimit" and os.geteuid() == 0:
        assert res["forked"] <= bound, res
    else:
        assert res["error"] == "EAGAIN" and res["forked"] < 512, res
    assert wait_until_gone(marker, 10) == []
    assert wait_until_pid_namespace_is_empty(res["pidns"], 10) == []
    assert subprocess.run(["true"], timeout=10).returncode == 0  # the host can still fork


def test_memory_bomb_fails_at_the_limit(box, tmp_path):
    """Allocating (and writing) 16 MiB at a time under --memory 256M: MemoryError (an address
    space limit), or the payload is killed and the record says oom_killed (a cgroup limit)."""
    record = tmp_path / "r.json"
    result = box.py("""
        chunks = []
        try:
            while len(chunks) < 128:  # 2 GiB at most
                chunks.append(bytearray(16 << 20))  # written, so really allocated
        except MemoryError:
            finish(chunks=len(chunks))
            raise SystemExit(3)
        finish(chunks=len(chunks))
    """, options=["--memory", "256M", "--json", str(record)])
    res = parse_results(result.stdout)
    if result.returncode == 3:
        assert 1 <= res["chunks"] <= 16, res
    else:
        assert result.returncode == 128 + 9, result
        assert json.loads(record.read_text())["oom_killed"] is True


def _memory_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def test_default_memory_limit_stops_a_bomb(box, tmp_path):
    """Without --memory the documented default (4 GiB) holds. As rlimits: reserving private
    memory 256 MiB at a time fails with ENOMEM before 4 GiB (RLIMIT_DATA), shared memory before
    16 GiB (RLIMIT_AS; nothing is touched). As a cgroup limit: writing 256 MiB at a time ends in
    an OOM kill before 4.5 GiB."""
    record = tmp_path / "r.json"
    probe = box.sh("true", options=["--json", str(record)])
    assert probe.returncode == 0, probe.stderr
    memory = json.loads(record.read_text())["limits"]["memory"]
    assert memory["value"] == 4 << 30, memory
    if memory["enforced_by"] == "rlimit":
        result, res = box.py_results("""
            import mmap
            counts = {}
            for kind, flags in (("private", mmap.MAP_PRIVATE), ("shared", mmap.MAP_SHARED)):
                maps = []
                try:
                    while len(maps) < 80:  # 20 GiB at most
                        maps.append(mmap.mmap(-1, 256 << 20, flags=flags | mmap.MAP_ANONYMOUS))
                except OSError as e:
                    counts[kind] = [len(maps), ename(e.errno)]
                else:
                    counts[kind] = [len(maps), None]
                del maps
            finish(**counts)
        """)
        assert res["private"][1] == "ENOMEM" and res["private"][0] < 16, res
        assert res["shared"][1] == "ENOMEM" and res["shared"][0] < 64, res
        return
    assert memory["enforced_by"].startswith("cgroup"), memory
    if _memory_available() < 6 << 30:
        pytest.skip("the host has less than 6 GiB of available memory: the 4 GiB default cannot "
                    "be exercised without starving it")
    result = box.py("""
        import mmap
        chunks = []
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE  # faulted in at once
        while len(chunks) < 18:  # 4.5 GiB at most
            chunks.append(mmap.mmap(-1, 256 << 20, flags=flags))
            print(len(chunks), flush=True)
    """, options=["--json", str(record)], timeout=120)
    data = json.loads(record.read_text())
    assert result.returncode == 128 + 9 and data["oom_killed"] is True, (result, data)
    assert int(result.stdout.split()[-1]) < 17, result.stdout


def test_default_limits_are_applied_and_recorded(box, tmp_path):
    record = tmp_path / "r.json"
    result, res = box.py_results("""
        limits = {}
        for line in open("/proc/self/limits").readlines()[1:]:
            name, soft, hard = line[:26].strip(), line[26:47].strip(), line[47:68].strip()
            limits[name] = [soft, hard]
        finish(limits=limits)
    """, options=["--json", str(record)])
    limits = res["limits"]
    data = json.loads(record.read_text())
    defaults = {"pids": (512, "Max processes"), "memory": (4 << 30, "Max data size"),
                "open_files": (4096, "Max open files")}
    for name, (value, rlimit_name) in defaults.items():
        entry = data["limits"][name]
        assert entry["value"] == value and type(entry["value"]) is int, (name, entry)
        if entry["enforced_by"] == "rlimit":
            assert limits[rlimit_name] == [str(value)] * 2, (name, limits)
        else:
            assert entry["enforced_by"].startswith("cgroup"), (name, entry)
    assert limits["Max core file size"] == ["0", "0"], limits
    if data["limits"]["memory"]["enforced_by"] == "rlimit":
        # The address space is bounded too, looser (docs/run.md, "Sizes and limits").
        assert limits["Max address space"] == [str(16 << 30)] * 2, limits
    assert limits["Max file size"] == ["unlimited"] * 2, limits
    assert data["limits"]["file_size"] == {"value": None, "enforced_by": "none"}, data
    assert data["oom_killed"] is False, data


def _free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_disk_fill_stops_at_the_tmpfs_cap(box, marker):
    """/tmp, the overlay root's upper layer and /dev/shm, filled in turn (each emptied before the
    next), each fill to the sandbox's one budget (32 MiB here) and end with ENOSPC; the host's
    disk does not pay for it."""
    watched = ["/", "/tmp", "/dev/shm"]
    before = {path: _free_bytes(path) for path in watched}
    result, res = box.py_results("""
        block = b"x" * (1 << 20)
        for area, path in (("tmp", "/tmp/fill"), ("root", "/fill"), ("shm", "/dev/shm/fill")):
            written = 0
            try:
                with open(path, "wb") as f:
                    while written < (256 << 20):
                        written += f.write(block)
                        f.flush()
            except OSError as e:
                RESULTS[area] = [ename(e.errno), written]
            else:
                RESULTS[area] = ["no limit", written]
            os.unlink(path)
        finish()
    """, options=["--tmpfs-size", "32M"])
    for area in ("tmp", "root", "shm"):
        error, written = res[area]
        assert error == "ENOSPC", (area, res)
        assert 16 * MiB <= written <= 32 * MiB, (area, res)
    for path in watched:
        # the three fills total 96 MiB; allow for unrelated activity on the host
        assert before[path] - _free_bytes(path) < 48 * MiB, path
    assert not os.path.exists(f"/tmp/{marker}")


def test_root_tmp_and_shm_share_one_budget(box):
    """Filled together (nothing removed), the root's writable layer, /tmp, /dev/shm and a file
    copied up from the image hold no more than the one budget between them: each fill ends with
    ENOSPC, and the sum stays within --tmpfs-size (32 MiB)."""
    _, res = box.py_results("""
        block = b"x" * (1 << 20)
        files = []
        for area, path in (("tmp", "/tmp/fill"), ("shm", "/dev/shm/fill"), ("root", "/fill"),
                           ("tmp2", "/tmp/fill2")):
            f = open(path, "wb")
            files.append(f)
            written = 0
            try:
                while written < (24 << 20):
                    written += f.write(block)
                    f.flush()
            except OSError as e:
                RESULTS[area] = [ename(e.errno), written]
            else:
                RESULTS[area] = ["ok", written]
        # A copy-up of an image file takes from the same budget: none is left.
        try:
            with open("/etc/os-release", "a") as f:
                f.write("x")
            RESULTS["copy_up"] = "ok"
        except OSError as e:
            RESULTS["copy_up"] = ename(e.errno)
        sizes = {os.statvfs(p).f_blocks * os.statvfs(p).f_frsize for p in ("/", "/tmp", "/dev/shm")}
        finish(sizes=sorted(sizes))
    """, options=["--tmpfs-size", "32M"])
    total = sum(written for _, written in (res[a] for a in ("tmp", "shm", "root", "tmp2")))
    assert res["tmp"] == ["ok", 24 * MiB], res
    for area in ("shm", "root", "tmp2"):
        assert res[area][0] == "ENOSPC", (area, res)
    assert 24 * MiB < total <= 32 * MiB, res
    assert res["copy_up"] == "ENOSPC", res
    assert res["sizes"] == [32 * MiB], res


def test_tmpfs_writes_count_against_the_memory_cgroup(box, tmp_path):
    """With a cgroup, the sandbox's tmpfs pages are charged to it: a budget larger than --memory
    still cannot hold more than the memory limit. The writer is what the OOM killer ends (not
    sqbox's init: the run ends normally, with oom_killed in the record). Tmpfs pages count toward
    no process's size, so each writer asks to be the OOM killer's first choice: else it could pick
    the shell, as small as the writer, between truncating a count and writing it."""
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    record = tmp_path / "r.json"
    result = box.sh("""
        for area in /tmp /dev/shm /; do
            i=0
            while sh -c 'echo 1000 > /proc/self/oom_score_adj &&
                         exec dd if=/dev/zero of="$0" bs=1M count=1 2>/dev/null' $area/fill$i; do
                i=$((i + 1)); echo $i > /out/$(echo $area | tr / _)
                [ $i -lt 512 ] || break
            done
            rm -f $area/fill*
        done
        echo survived
    """, options=["--memory", "64M", "--tmpfs-size", "1G", "--mount", f"{out}:/out",
                  "--json", str(record)])
    data = json.loads(record.read_text())
    if data["limits"]["memory"]["enforced_by"] not in ("cgroup-v2", "cgroup-v1"):
        pytest.skip("needs a cgroup memory controller (root, or --cgroup with a delegated cgroup "
                    "v2): without one, only the tmpfs budget bounds tmpfs writes")
    written = {name: int((out / name).read_text()) for name in ("_tmp", "_dev_shm", "_")}
    for name, mib in written.items():
        assert 0 < mib < 64, (name, written, result.stderr)
    assert data["oom_killed"] is True, data
    assert result.returncode == 0 and result.stdout.endswith("survived\n"), result


def test_an_endless_print_loop_reaches_a_capturing_harness_bounded(box, tmp_path):
    """A harness that captures output (subprocess.run with stdout=PIPE) of a payload printing in
    an endless loop gets 16 MiB of each stream by default, a line saying so and the record's
    flags; the payload runs on (its output discarded) until the timeout ends it."""
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    record = tmp_path / "r.json"
    script = (
        "import os, sys\n"
        "line = 'x' * 1023 + '\\n'\n"
        "written = 0\n"
        "while True:\n"
        "    print(line, end='')\n"
        "    print(line, end='', file=sys.stderr)\n"
        "    written += 1024\n"
        "    if written % (1 << 22) == 0:\n"
        # Whole or not at all: the timeout's SIGKILL may come between a truncate and a write.
        "        open('/out/written.new', 'w').write(str(written))\n"
        "        os.replace('/out/written.new', '/out/written')\n")
    start = time.monotonic()
    result = subprocess.run(
        box.argv(box.python_image, ["python3", "-c", script, box.marker],
                 ["--timeout", "10", "--mount", f"{out}:/out", "--json", str(record)]),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert time.monotonic() - start < 60
    assert result.returncode == 124, result.stderr[-300:]
    assert len(result.stdout) == 16 * MiB
    assert result.stdout == (b"x" * 1023 + b"\n") * (16 * 1024)
    payload_err, _, notes = result.stderr.partition(b"sqbox:")
    assert payload_err == (b"x" * 1023 + b"\n") * (16 * 1024)
    assert (b"sqbox: output truncated: stdout and stderr passed --output-limit (16777216 bytes)"
            in result.stderr), result.stderr[-300:]
    data = json.loads(record.read_text())
    assert data["stdout_truncated"] is True and data["stderr_truncated"] is True, data
    assert data["timed_out"] is True, data
    # It kept running past the cap: more was written than passed.
    assert int((out / "written").read_text()) > 16 * MiB


def test_output_flood_is_capped(box, tmp_path):
    record = tmp_path / "r.json"
    limit = 65536
    start = time.monotonic()
    result = box.py("""
        chunk = b"y" * 65536
        for _ in range(256):  # 16 MiB to each stream
            os.write(1, chunk)
            os.write(2, chunk)
        raise SystemExit(0)
    """, options=["--output-limit", str(limit), "--json", str(record)], text=False)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-300:]
    out, err = result.stdout, result.stderr
    assert len(out) <= limit, f"{len(out)} bytes of stdout passed through"
    assert out == b"y" * len(out), out[:200]
    # sqbox may add one line of its own (a note on the truncation) to stderr
    payload_err = err.split(b"sqbox:")[0]
    assert len(payload_err) <= limit, f"{len(payload_err)} bytes of stderr passed through"
    assert err.count(b"\n") <= 1, err[-300:]
    assert elapsed < 20
    data = json.loads(record.read_text())
    assert data["truncated"] is True and data["stdout_truncated"] is True, data
    assert data["stderr_truncated"] is True, data

    small = box.py("print('short')", options=["--output-limit", str(limit), "--json",
                                              str(record)])
    assert small.stdout == "short\n"
    data = json.loads(record.read_text())
    assert data["truncated"] is False and data["stdout_truncated"] is False, data


def test_tmpfs_inodes_are_capped_with_the_size(box):
    """Empty directories cost kernel memory but no tmpfs bytes: --tmpfs-size also caps the inode
    count (one per 16 KiB, at least 1024), so a 1 MiB /tmp cannot pin gigabytes of slab."""
    _, res = box.py_results("""
        made = 0
        try:
            while made < 100000:
                os.mkdir("/tmp/d%d" % made)
                made += 1
        except OSError as e:
            RESULTS["error"] = ename(e.errno)
        finish(made=made)
    """, options=["--tmpfs-size", "1M"])
    assert res["error"] == "ENOSPC", res
    assert res["made"] <= 1024, res


def test_host_wide_aio_contexts_are_out_of_reach(box):
    """fs.aio-max-nr is one pool for the whole host: io_setup answers ENOSYS (libaio falls back)."""
    _, res = box.py_results("""
        ctx = ctypes.c_ulong(0)
        note("io_setup", sysc(206, 4096, ctypes.addressof(ctx)))
        finish()
    """)
    assert res["io_setup"] == "ENOSYS", res


def test_payload_cannot_lower_the_limits_of_init(box):
    """prlimit64 on pid 1 (sqbox's init, same user) would let the payload have init killed by
    RLIMIT_CPU; only the caller's own limits (pid 0) may change."""
    _, res = box.py_results("""
        import resource
        attempt("init", resource.prlimit, 1, resource.RLIMIT_CPU, (1, 1))
        attempt("self", resource.prlimit, 0, resource.RLIMIT_CPU, (100, 100))
        # Reading them changes nothing, and a pid that names no process is ESRCH, as outside.
        attempt("read init", resource.prlimit, 1, resource.RLIMIT_CPU)
        attempt("read none", resource.prlimit, -1, resource.RLIMIT_AS)
        finish(init_cpu=resource.prlimit(1, resource.RLIMIT_CPU))
    """)
    assert res == {"init": "EPERM", "self": "ok", "read init": "ok", "read none": "ESRCH",
                   "init_cpu": [-1, -1]}, res


def test_sysv_ipc_is_capped_with_root_mapping(box):
    """With --root (uid 0 of the sandbox's user namespace, which owns its ipc namespace) sqbox
    caps System V shared memory at --tmpfs-size and message queues at 256."""
    _, res = box.py_results("""
        read = lambda name: int(open("/proc/sys/kernel/" + name).read())
        finish(shmmax=read("shmmax"), shmall=read("shmall"), msgmni=read("msgmni"))
    """, options=["--root", "--tmpfs-size", "64M"])
    assert res == {"shmmax": 64 * MiB, "shmall": 64 * MiB // 4096, "msgmni": 256}, res

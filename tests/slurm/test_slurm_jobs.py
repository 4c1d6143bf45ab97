"""sqbox inside Slurm jobs, as an unprivileged user: docs/slurm.md's batch script (run as the
doc shows it), srun steps, the enroot front end in a step, and scancel of a running job."""
import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
from host_mounts import fuse_connections
from host_processes import processes_with, wait_until_gone, wait_until_pid_namespace_is_empty

DOC = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"

# A task that waits until the test releases it: all eight can only have started when eight
# sandboxes run at once. /tasks is a read-only bind of the host directory, so the release file
# the host makes appears inside.
BARRIER_TASK = """\
import os, sys, time
print("started", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists("/tasks/release"):
    if time.monotonic() > deadline:
        sys.exit("never released")
    time.sleep(0.05)
print({n} * {n})
"""

MEMORY_TASK = """\
data = bytearray(1 << 30)   # 1 GiB, twice the script's --memory
print("allocated", len(data))
"""

TIMEOUT_TASK = """\
print("spinning", flush=True)
while True:
    pass
"""

# Prints the sandbox's pid namespace as the host names it, then waits to be cancelled.
LONG_TASK = """\
import os, signal, time
{ignore}print(os.readlink("/proc/self/ns/pid"), flush=True)
time.sleep(1000)
"""

# A payload that tries to outlive scancel by ignoring its SIGTERM.
IGNORE_SIGTERM = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"


def batch_script_from_doc():
    """The batch script of docs/slurm.md: the code block that starts with #!/bin/bash."""
    blocks = re.findall(r"^```sh\n(.*?)^```", DOC.read_text(), re.S | re.M)
    scripts = [b for b in blocks if b.startswith("#!/bin/bash\n") and "#SBATCH" in b]
    assert len(scripts) == 1, f"expected one batch script in {DOC}, found {len(scripts)}"
    return scripts[0]


def user_dir(slurm, name):
    """A fresh directory in the job user's work directory."""
    path = slurm.work / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    os.chown(path, *owner(slurm))
    return path


def owner(slurm):
    st = slurm.work.stat()
    return st.st_uid, st.st_gid


def write_user_file(slurm, path, text, mode=0o644):
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, *owner(slurm))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.1)


def read(path):
    try:
        return path.read_text()
    except OSError:
        return ""


def submit_recipe(slurm, sqbox_bin, image, tasks, results, **variables):
    script = slurm.work / "run-tasks.sbatch"
    if not script.exists():
        write_user_file(slurm, script, batch_script_from_doc(), mode=0o755)
    exports = {"SQBOX": sqbox_bin, "IMAGE": image, "TASKS": str(tasks),
               "RESULTS": str(results), **variables}
    job = slurm.sbatch(script, "--output", str(results.parent / f"{results.name}.log"),
                       "--export", "ALL," + ",".join(f"{k}={v}" for k, v in exports.items()))
    return job


def test_batch_script_from_the_doc_runs_eight_sandboxes_at_once_with_limits(
        slurm, sqbox_bin, python_image):
    tasks = user_dir(slurm, "tasks")
    results = slurm.work / f"results-{tasks.name}"
    for n in range(8):
        write_user_file(slurm, tasks / f"task_{n}.py", BARRIER_TASK.format(n=n))
    write_user_file(slurm, tasks / "task_memory.py", MEMORY_TASK)
    write_user_file(slurm, tasks / "task_timeout.py", TIMEOUT_TASK)

    job = submit_recipe(slurm, sqbox_bin, python_image, tasks, results)
    started = lambda: all(read(results / f"task_{n}.out").startswith("started") for n in range(8))
    wait_for(started, 90, "eight sandboxes running at once")
    # None of them can have ended (sqbox opens its record at the start, writes it at the end).
    assert [read(results / f"task_{n}.json") for n in range(8)] == [""] * 8
    (tasks / "release").touch()

    fields = slurm.wait_for_job(job)
    log = read(results.parent / f"{results.name}.log")
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log)

    assert sorted(p.name for p in results.glob("*.json")) == sorted(
        [f"task_{n}.json" for n in range(8)] + ["task_memory.json", "task_timeout.json"]), log
    for n in range(8):
        name = f"task_{n}"
        record = json.loads(read(results / f"{name}.json"))
        assert record["exit_code"] == 0, (record, read(results / f"{name}.err"), log)
        assert record["limits"]["memory"]["value"] == 512 << 20
        assert read(results / f"{name}.out") == f"started\n{n * n}\n"

    # Past --memory: with no cgroup of its own (a plain user's job) the allocation fails;
    # with one, the OOM killer ends the payload (137). Either way it never allocated.
    record = json.loads(read(results / "task_memory.json"))
    assert record["limits"]["memory"]["value"] == 512 << 20
    assert "allocated" not in read(results / "task_memory.out")
    if record["limits"]["memory"]["enforced_by"] == "rlimit":
        assert record["exit_code"] == 1, record
        assert "MemoryError" in read(results / "task_memory.err")
    else:
        assert record["exit_code"] == 137 and record["oom_killed"], record

    # Past --timeout: the sandbox is killed, status 124.
    record = json.loads(read(results / "task_timeout.json"))
    assert record["exit_code"] == 124 and record["timed_out"] is True, record
    assert read(results / "task_timeout.out") == "spinning\n"
    assert "sqbox: timed out after" in read(results / "task_timeout.err")


def test_jobs_are_tracked_as_configured(slurm):
    # The suite's two clusters differ in how Slurm finds a job's processes; check that they do.
    cgroups = slurm.as_user(["srun", "cat", "/proc/self/cgroup"], check=True).stdout
    in_job_cgroup = re.search(r"/slurm[^/]*/uid_\d+/job_\d+/step_", cgroups) is not None
    assert in_job_cgroup == (slurm.tracking == "cgroup"), cgroups


def test_srun_runs_a_sandbox_per_task(slurm, sqbox_bin, busybox_image):
    result = slurm.as_user(["srun", "--ntasks", "2", sqbox_bin, "run", "--env", "SLURM_PROCID",
                            busybox_image, "--", "sh", "-c",
                            'echo "rank $SLURM_PROCID uid $(id -u) host $(hostname)"'])
    assert result.returncode == 0, result.stderr
    uid = owner(slurm)[0]
    assert sorted(result.stdout.splitlines()) == [f"rank {r} uid {uid} host sandbox"
                                                  for r in (0, 1)]


def test_srun_step_past_timeout_ends_with_124(slurm, sqbox_bin, busybox_image):
    result = slurm.as_user(["srun", sqbox_bin, "run", "--timeout", "1", busybox_image, "--",
                            "sleep", "100"])
    assert result.returncode == 124, result.stderr
    assert "sqbox: timed out after" in result.stderr


def test_srun_step_past_memory_fails_to_allocate(slurm, sqbox_bin, python_image):
    result = slurm.as_user(["srun", sqbox_bin, "run", "--memory", "256M", python_image, "--",
                            "python3", "-c", "b = bytearray(1 << 30); print('allocated')"])
    assert "allocated" not in result.stdout
    assert result.returncode == 1 and "MemoryError" in result.stderr, result.stderr


def test_enroot_front_end_in_a_step(slurm, sqbox_bin, python_image):
    # A pyxis-less harness: `enroot create` and `enroot start` in a step, with sqbox on PATH as
    # enroot.
    bin_dir = Path(sqbox_bin).parent
    if not (bin_dir / "enroot").exists():
        (bin_dir / "enroot").symlink_to("sqbox")
    data = user_dir(slurm, "enroot-data")
    step = ('enroot create --name task "$1" && '
            'enroot start task python3 -c "import os; print(6 * 7, os.getuid())" && '
            'enroot remove -f task && enroot list')
    result = slurm.as_user(["srun", "sh", "-c", step, "step", python_image],
                           env={"PATH": f"{bin_dir}:/usr/bin:/bin",
                                "ENROOT_DATA_PATH": str(data)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"42 {owner(slurm)[0]}"
    # Removed: `enroot list` printed nothing after the result, and only the store's lock file
    # stays.
    assert [n for n in os.listdir(data) if n != ".sqbox-store.lock"] == []


class NodeSnapshot:
    """What a cancelled job must not add to the node."""

    def __init__(self):
        self.mountinfo = Path("/proc/self/mountinfo").read_text()
        self.tmp = set(os.listdir("/tmp"))
        self.shm = set(os.listdir("/dev/shm"))


def sandbox_like_mounts(before, token):
    """Mounts the host has now and did not `before` that a sandbox could have left: FUSE or
    overlay mounts, or any naming the test's token (other work on the machine may mount other
    things meanwhile, e.g. an image build's /dev and /proc)."""
    found = []
    for line in set(Path("/proc/self/mountinfo").read_text().splitlines()) - set(
            before.splitlines()):
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype.startswith("fuse") or fstype == "overlay" or token in line:
            found.append(line)
    return found


def new_files_of(uid, directory, before):
    """Entries of `directory` that `uid` owns and that were not there `before`."""
    found = []
    for name in sorted(set(os.listdir(directory)) - before):
        try:
            if os.lstat(os.path.join(directory, name)).st_uid == uid:
                found.append(name)
        except OSError:  # gone meanwhile
            pass
    return found


def sandbox_fuse_connections(pids):
    """The FUSE connections of the image mounts that `pids` see (a connection's id is the minor
    device number of its mount): the sandboxes' own, told apart from those of anything else
    running on the machine."""
    found = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype == "fuse" or fstype.startswith("fuse."):
                found.add(fields[2].split(":")[1])
    return found


def wait_until_connections_are_gone(connections, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = sorted(connections & set(fuse_connections() or []))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


# A batch script without the recipe's trap: under proctrack/cgroup the sandboxes then end by
# Slurm's SIGKILL, the moment the shell has died of its SIGTERM.
BARE_SCRIPT = """\
#!/bin/bash
for n in 0 1 2 3; do
    "$SQBOX" run --mount "$TASKS:/tasks:ro" "$IMAGE" -- python3 /tasks/task_$n.py \
        >"$RESULTS/task_$n.out" 2>"$RESULTS/task_$n.err" &
done
wait
"""


def submit_bare_script(slurm, sqbox_bin, image, tasks, results, **variables):
    results.mkdir(mode=0o755)
    os.chown(results, *owner(slurm))
    script = tasks / "bare.sbatch"
    write_user_file(slurm, script, BARE_SCRIPT, mode=0o755)
    exports = {"SQBOX": sqbox_bin, "IMAGE": image, "TASKS": str(tasks), "RESULTS": str(results),
               **variables}
    return slurm.sbatch(script, "--output", str(results / "job.log"),
                        "--export", "ALL," + ",".join(f"{k}={v}" for k, v in exports.items()))


@pytest.mark.parametrize("script", ["recipe", "bare"])
def test_scancel_leaves_no_process_mount_or_file(slurm, sqbox_bin, python_image, script):
    tasks = user_dir(slurm, "tasks")  # its unique name is in every sqbox's argv (--mount)
    results = slurm.work / f"results-{tasks.name}"
    # Under the recipe the last task ignores SIGTERM: Slurm's SIGKILL must still reach it.
    stubborn = 3 if script == "recipe" else None
    for n in range(4):
        write_user_file(slurm, tasks / f"task_{n}.py",
                        LONG_TASK.format(ignore=IGNORE_SIGTERM if n == stubborn else ""))
    before = NodeSnapshot()

    # The sandboxes share the image's server (docs/run.md, "The shared image server"); under
    # proctrack/linuxproc it is no longer the job's once started, and leaves after its idle time.
    # (A server an earlier test's job left idling, met at the same abstract name when the jobs'
    # cgroups are alike, is the one server too.) A cache directory of the job's own.
    cache = user_dir(slurm, "cache")
    cache.chmod(0o700)
    idle = {"SQBOX_IMAGE_SERVER_IDLE": "3", "SQBOX_CACHE_DIR": str(cache)}
    if script == "recipe":
        job = submit_recipe(slurm, sqbox_bin, python_image, tasks, results, TIMEOUT=600, **idle)
    else:
        job = submit_bare_script(slurm, sqbox_bin, python_image, tasks, results, **idle)
    outs = [results / f"task_{n}.out" for n in range(4)]
    wait_for(lambda: all(read(o).startswith("pid:[") for o in outs), 90,
             "four sandboxes running")
    namespaces = [read(o).split()[0] for o in outs]
    assert len(set(namespaces)) == 4
    sqbox_processes = processes_with(tasks.name)
    assert len(sqbox_processes) >= 4  # the sqbox processes the check below expects gone
    connections = sandbox_fuse_connections(sqbox_processes)
    assert len(connections) == 1, connections  # one image server for the four sandboxes
    for namespace in namespaces:
        assert wait_until_pid_namespace_is_empty(namespace, 0) != [], namespace

    result = slurm.as_user(["scancel", job], check=True)
    fields = slurm.wait_for_job(job, timeout=60)
    assert fields["JobState"] == "CANCELLED", fields
    wait_for(lambda: not slurm.job_step_sockets(), 60, "the job's steps ending")

    assert wait_until_gone(tasks.name, 10) == [], "sqbox processes left behind"
    for namespace in namespaces:
        assert wait_until_pid_namespace_is_empty(namespace, 5) == [], \
            f"payload processes left in {namespace}"
    if fuse_connections() is not None:  # fusectl mounted (scripts/test-slurm mounts it)
        assert wait_until_connections_are_gone(connections, 15) == [], \
            "FUSE connection left behind"
    assert sandbox_like_mounts(before.mountinfo, tasks.name) == []
    # sqbox makes no host files. Only the job user's count: other work on the machine (the
    # project's tools and suites, run as root) may come and go meanwhile.
    assert new_files_of(owner(slurm)[0], "/tmp", before.tmp) == []
    assert new_files_of(owner(slurm)[0], "/dev/shm", before.shm) == []
    assert result.returncode == 0

    # The recipe's sandboxes ended by Slurm's SIGTERM, not by a SIGKILL: the trap passed it on to
    # each sqbox, which passed it on to the payload, which died of it, and sqbox wrote its record
    # (but the stubborn one's, which the SIGKILL ended, sqbox and all). Under proctrack/linuxproc
    # each sqbox got Slurm's SIGTERM too, so the trap's may come just as its sandbox has ended
    # (test_basics.py, test_a_sigterm_as_the_sandbox_ends_leaves_the_record_and_the_status).
    if script != "recipe":
        return
    job_log = read(results.parent / f"{results.name}.log")
    for n in range(3):
        text = read(results / f"task_{n}.json")
        err = read(results / f"task_{n}.err")
        assert text, f"task_{n}: no record; its stderr: {err!r}; the job's log: {job_log!r}"
        record = json.loads(text)
        assert record["signal"] == 15 and record["exit_code"] == 143, \
            (record, f"task_{n}'s stderr: {err!r}; the job's log: {job_log!r}")

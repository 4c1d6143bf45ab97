"""A single-node Slurm cluster on localhost for the tests of sqbox inside Slurm jobs.

The cluster is Debian's packages (munge, slurmctld, slurmd, slurm-client) started as root with
a configuration, key, sockets, state, spool and logs of its own under one temporary directory,
on ports of its own: it does not touch the host's /etc/slurm, /etc/munge or a munged already
running. Jobs run as an unprivileged user (sqbox-test, as scripts/test creates it), which is how
sqbox runs on a cluster. Everything is stopped and removed at the end of the session.

The suite runs twice, once for each way Slurm finds a job's processes (what scancel signals):
by their parents (proctrack/linuxproc, which works anywhere) and by the job's cgroup
(proctrack/cgroup with task/cgroup confining the job's CPUs and memory, as most clusters run; it
needs a cgroup layout Slurm 22.05 handles, e.g. v1 or hybrid).

Where Slurm cannot start, the tests skip naming the missing package or what failed; with
SQBOX_REQUIRE_SLURM=1 (scripts/test-slurm in CI) they fail instead, for the parent-tracked
cluster (the cgroup one depends on the host's cgroup layout, so it only ever skips).
"""
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import test_inputs  # noqa: E402  (needs the path above)

TEST_USER = os.environ.get("SQBOX_TEST_USER", "sqbox-test")

# The programs the cluster needs, and the Debian package that has each.
PROGRAMS = {
    "munged": "munge", "munge": "munge",
    "slurmctld": "slurmctld", "slurmd": "slurmd",
    "sbatch": "slurm-client", "srun": "slurm-client", "scancel": "slurm-client",
    "squeue": "slurm-client", "scontrol": "slurm-client", "sinfo": "slurm-client",
}


def cannot_start(reason, required=True):
    if required and os.environ.get("SQBOX_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm cluster: {reason}")
    pytest.skip(f"Slurm cluster: {reason}")


def find_program(name):
    # The daemons live in /usr/sbin, which a plain user's PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path, lines=15):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class Cluster:
    """A running cluster; commands run as the test user in a job directory of its own."""

    def __init__(self, root, user, tracking):
        self.root = root
        self.user = user
        self.tracking = tracking  # "linuxproc" or "cgroup"
        self.conf = root / "etc" / "slurm.conf"
        self.work = root / "work"  # the user's: job scripts, outputs, results
        # slurmctld runs only where SlurmctldHost names the machine; the node's name is free
        # (slurmd is told it), and neither needs to resolve: both are given 127.0.0.1.
        self.controller = socket.gethostname().split(".")[0]
        self.node = "sqboxnode"
        self.daemons = []  # (name, Popen, log path), in start order
        self.cgroups_before = slurm_cgroups()  # Slurm's own, to remove those it adds

    # Commands as the user.

    def user_env(self, extra=None):
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": pwd.getpwnam(self.user).pw_dir,
            "USER": self.user, "LOGNAME": self.user,
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.conf),
        }
        env.update(extra or {})
        return env

    def as_user(self, argv, env=None, timeout=120, check=False, cwd=None):
        command = ["runuser", "-u", self.user, "--", "env", "-i",
                   *(f"{k}={v}" for k, v in self.user_env(env).items()), *argv]
        result = subprocess.run(command, cwd=cwd or self.work, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, (
                f"{argv[0]} exited {result.returncode}\nstdout: {result.stdout}\n"
                f"stderr: {result.stderr}")
        return result

    def sbatch(self, script, *options, env=None):
        """Submits `script` (a path the user can read) and returns the job id."""
        result = self.as_user(["sbatch", "--parsable", *options, str(script)], env=env,
                              check=True)
        return result.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol's fields of the job (finished jobs are kept for MinJobAge seconds)."""
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.root_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_for_job(self, job_id, timeout=120):
        """Waits until the job has ended; returns its fields."""
        deadline = time.monotonic() + timeout
        ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                 "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in ended:
                return fields
            assert time.monotonic() < deadline, f"job {job_id} still {fields.get('JobState')}"
            time.sleep(0.2)

    # Administration as root.

    def root_env(self):
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def node_state(self):
        result = subprocess.run(["sinfo", "-h", "-n", self.node, "-o", "%t"],
                                env=self.root_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=30)
        return result.stdout.strip()

    def job_step_sockets(self):
        """slurmstepd's sockets in the spool directory: one per step still running."""
        spool = self.root / "spool"
        return [p.name for p in spool.iterdir() if p.is_socket()] if spool.is_dir() else []


TRACKING = {
    # Processes found through their parents: no cgroup plugin, so this works on cgroup v1, v2
    # and hybrid hosts and in containers alike.
    "linuxproc": "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n",
    # Processes found in the job's cgroup, which also confines its CPUs and memory (--mem).
    "cgroup": "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n",
}


def slurm_cgroups():
    """The cgroup directories Slurm makes (slurm, slurm_NODE, under each hierarchy)."""
    base = Path("/sys/fs/cgroup")
    candidates = [base] + [p for p in base.iterdir() if p.is_dir() and not p.is_symlink()]
    return {child for parent in candidates for child in parent.glob("slurm*") if child.is_dir()}


def remove_cgroups(paths):
    """Removes the cgroup directories (deepest first: rmdir is the only way); returns those
    that stay."""
    for path in paths:
        for directory in sorted((p for p in path.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True) + [path]:
            try:
                directory.rmdir()
            except OSError:
                pass
    return sorted(str(p) for p in paths if p.exists())


def write_config(cluster, munge_socket):
    root = cluster.root
    memory_mb = 4096
    cpus = max(2, os.cpu_count() or 1)
    text = f"""\
ClusterName=sqboxtest
SlurmctldHost={cluster.controller}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
{TRACKING[cluster.tracking]}JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
# The node as configured here, whatever the machine has (the recipe asks for 2 CPUs and 4 GiB;
# nothing here enforces memory).
SlurmdParameters=config_overrides
# Seconds between scancel's SIGTERM and its SIGKILL (Slurm's default is 30).
KillWait=5
MinJobAge=600
NodeName={cluster.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=test Nodes={cluster.node} Default=YES MaxTime=30 State=UP
"""
    cluster.conf.write_text(text)
    cluster.conf.chmod(0o644)
    if cluster.tracking == "cgroup":
        # Slurm reads cgroup.conf beside slurm.conf.
        cgroup_conf = cluster.conf.parent / "cgroup.conf"
        cgroup_conf.write_text("CgroupPlugin=autodetect\nConstrainCores=yes\n"
                               "ConstrainRAMSpace=yes\n")
        cgroup_conf.chmod(0o644)


def start_daemon(cluster, name, argv, log):
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env=cluster.root_env(), start_new_session=True)
    cluster.daemons.append((name, process, log))
    return process


def wait_until(predicate, timeout, what, cluster):
    required = cluster.tracking == "linuxproc"
    deadline = time.monotonic() + timeout
    while not predicate():
        for name, process, log in cluster.daemons:
            if process.poll() is not None:
                cannot_start(f"{name} ({cluster.tracking}) exited with status "
                             f"{process.returncode}:\n{log_tail(log)}", required)
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}:\n{log_tail(log)}" for name, _, log in cluster.daemons)
            cannot_start(f"{what} ({cluster.tracking}) did not happen within {timeout} s\n{logs}",
                         required)
        time.sleep(0.1)


def start_cluster(cluster):
    root = cluster.root
    # munged insists: its key and logs private to it, its socket's directory open to all.
    (root / "munge").mkdir(mode=0o700)
    (root / "munge-socket").mkdir(mode=0o755)
    for name in ("etc", "state", "spool", "log", "run"):
        (root / name).mkdir(mode=0o755)
    cluster.work.mkdir(mode=0o755)
    shutil.chown(cluster.work, user=cluster.user, group=pwd.getpwnam(cluster.user).pw_gid)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge-socket" / "munge.socket"
    start_daemon(cluster, "munged", [
        find_program("munged"), "--foreground", f"--socket={munge_socket}",
        f"--key-file={key}", f"--pid-file={root}/munge/munged.pid",
        f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/munged.seed",
    ], root / "log" / "munged.out")
    wait_until(munge_socket.exists, 20, "munged's socket appearing", cluster)

    write_config(cluster, munge_socket)
    start_daemon(cluster, "slurmctld", [find_program("slurmctld"), "-D", "-i", "-f",
                                        str(cluster.conf)], root / "log" / "slurmctld.out")
    start_daemon(cluster, "slurmd", [find_program("slurmd"), "-D", "-f", str(cluster.conf),
                                     "-N", cluster.node], root / "log" / "slurmd.out")
    wait_until(lambda: cluster.node_state() == "idle", 60, "the node becoming idle", cluster)
    # A node can be up and still fail every job (e.g. a cgroup layout its plugin cannot use).
    probe = cluster.as_user(["srun", "--time=1", "true"], timeout=60)
    if probe.returncode != 0:
        cannot_start(f"a probe job ({cluster.tracking}) failed: {probe.stderr.strip()}\n"
                     f"{log_tail(root / 'log' / 'slurmd.log')}",
                     required=cluster.tracking == "linuxproc")


def stop_cluster(cluster):
    # Jobs first: slurmstepd outlives slurmd, so running steps must end before the daemons go.
    if cluster.daemons and all(p.poll() is None for _, p, _ in cluster.daemons):
        subprocess.run(["scancel", "--full", "--user", cluster.user], env=cluster.root_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        deadline = time.monotonic() + 30
        while cluster.job_step_sockets() and time.monotonic() < deadline:
            time.sleep(0.2)
    for name, process, log in reversed(cluster.daemons):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    leftover = cluster.job_step_sockets()
    shutil.rmtree(cluster.root, ignore_errors=True)
    # Slurm leaves its (empty) cgroups behind; they are ours to remove.
    cgroups_left = remove_cgroups(slurm_cgroups() - cluster.cgroups_before)
    assert not leftover, f"job steps still running after the cluster stopped: {leftover}"
    assert not cgroups_left, f"Slurm's cgroups could not be removed: {cgroups_left}"


def interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", params=["linuxproc", "cgroup"])
def slurm(request):
    if os.geteuid() != 0:
        cannot_start("starting slurmctld and slurmd needs root (run scripts/test-slurm as root)")
    missing = sorted({pkg for prog, pkg in PROGRAMS.items() if not find_program(prog)})
    if missing:
        cannot_start(f"missing package(s) {', '.join(missing)} "
                     f"(apt-get install {' '.join(missing)})")
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        cannot_start(f"the unprivileged user {TEST_USER} does not exist (scripts/test-slurm "
                     "creates it)")
    # Under /tmp (world-traversable) so that the job user reaches its directory.
    root = Path(tempfile.mkdtemp(prefix="sqbox-slurm-", dir="/tmp"))
    root.chmod(0o755)
    cluster = Cluster(root, TEST_USER, request.param)
    # A SIGTERM (CI's `timeout`) must still stop the daemons: pytest tears down on
    # KeyboardInterrupt.
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        start_cluster(cluster)
        yield cluster
    finally:
        stop_cluster(cluster)
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def readable(slurm):
    """Returns a path to `path` that the job user can read: `path` itself, else a copy."""
    def make(path, mode=0o644):
        check = subprocess.run(["runuser", "-u", slurm.user, "--", "test", "-r", str(path)])
        if check.returncode == 0:
            return str(path)
        copy = slurm.root / "inputs" / Path(path).name
        copy.parent.mkdir(mode=0o755, exist_ok=True)
        shutil.copy(path, copy)
        copy.chmod(mode)
        return str(copy)
    return make


@pytest.fixture(scope="session")
def sqbox_bin(slurm):
    # Always a copy: the build tree may sit where the user cannot reach it.
    copy = slurm.root / "bin" / "sqbox"
    copy.parent.mkdir(mode=0o755)
    shutil.copy(test_inputs.executable_sqbox_binary(), copy)
    copy.chmod(0o755)
    return str(copy)


@pytest.fixture(scope="session")
def busybox_image(readable):
    return readable(test_inputs.image("busybox"))


@pytest.fixture(scope="session")
def python_image(readable):
    return readable(test_inputs.image("python"))

"""A pod-like outer container, built with bubblewrap the way runc and containerd build a pod's
container, in which the tests run sqbox as a pod's user would.

The outer container (Pod below) has, like a Kubernetes pod under containerd's defaults:
- new user, pid, mount, ipc and uts namespaces (bubblewrap's user namespace maps one id: the
  pod's user, uid and gid 1000, non-root, with no capability);
- its own root: the host's /usr (with /bin, /lib, /lib64, /sbin, /etc) read-only, a tmpfs /tmp,
  the test's files read-only under /sqbox, a writable cache directory;
- a `/proc` of its own pid namespace with runc's masked paths overmounted (files by /dev/null,
  directories by an empty read-only tmpfs; those that exist on this host) and its read-only
  paths read-only, or, for `proc="unmasked"` (`procMount: Unmasked`), a plain `/proc`;
- a minimal `/dev` (null, zero, full, random, urandom, tty, a devpts, shm) without /dev/fuse,
  unless `fuse=True` (a device plugin or a privileged pod);
- `/sys` read-only with /sys/firmware masked;
- Docker's default seccomp profile ($SQBOX_TESTDATA_DIR/docker-default-seccomp.json, the
  `RuntimeDefault` of most clusters), compiled as Docker applies it to a container with the
  default capability set (docker_seccomp.py), or none for `seccomp="unconfined"`.

crun would be closer still, but refuses this VM's hybrid cgroup layout; bubblewrap builds the
same namespaces and mounts.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import docker_seccomp  # noqa: E402
import test_inputs  # noqa: E402

POD_UID = 1000
# runc's defaults (libcontainer/specconv, containerd's oci.WithDefaults).
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
    "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
]
READ_ONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
# Where the pod finds what the test gives it (read-only).
POD_BIN = "/sqbox/bin/sqbox"
POD_IMAGES = "/sqbox/images"
POD_CACHE = "/cache"


def _bwrap():
    return shutil.which("bwrap")


class Pod:
    """One cell of the matrix: runs commands in a fresh outer container each time."""

    def __init__(self, sqbox_bin, images, cache, work, fuse=False, proc="masked",
                 seccomp="docker", seccomp_program=None, user_namespaces=True):
        self.sqbox_bin = sqbox_bin
        self.images = images      # host directory bound at POD_IMAGES
        self.cache = cache        # host directory bound writable at POD_CACHE
        self.work = work          # host directory bound writable at /work
        self.fuse = fuse
        self.proc = proc
        self.seccomp = seccomp
        self.seccomp_program = seccomp_program
        self.user_namespaces = user_namespaces

    def describe(self):
        return f"fuse={self.fuse} proc={self.proc} seccomp={self.seccomp}"

    def _argv(self, command):
        # bubblewrap's uid 0 sets the pod up; enter_pod.py then becomes the pod's user.
        argv = [_bwrap(), "--unshare-user", "--uid", "0", "--gid", "0",
                "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETFCAP", "--cap-add", "CAP_SETPCAP",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "pod",
                "--die-with-parent", "--new-session", "--clearenv"]
        for path in ["/usr", "/etc"]:
            argv += ["--ro-bind", path, path]
        for path in ["/bin", "/lib", "/lib64", "/sbin"]:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        argv += ["--tmpfs", "/tmp", "--dev", "/dev"]
        if self.fuse:
            argv += ["--dev-bind", "/dev/fuse", "/dev/fuse"]
        argv += ["--proc", "/proc"]
        if self.proc == "masked":
            for path in MASKED_PATHS:
                if os.path.isdir(path):
                    argv += ["--tmpfs", path, "--remount-ro", path]
                elif os.path.exists(path):
                    argv += ["--ro-bind", "/dev/null", path]
            for path in READ_ONLY_PATHS:
                # The host's entries: what they show does not depend on the pid namespace.
                if os.path.exists(path):
                    argv += ["--ro-bind", path, path]
        argv += ["--ro-bind", "/sys", "/sys"]
        if self.proc == "masked":
            for path in MASKED_PATHS:
                if path.startswith("/sys/") and os.path.isdir(path):
                    argv += ["--tmpfs", path, "--remount-ro", path]
        argv += ["--ro-bind", str(Path(__file__).resolve().parent / "enter_pod.py"),
                 "/sqbox/enter_pod.py"]
        argv += ["--ro-bind", self.sqbox_bin, POD_BIN, "--ro-bind", self.images, POD_IMAGES,
                 "--bind", self.cache, POD_CACHE, "--bind", self.work, "/work"]
        argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                 "--setenv", "HOME", "/tmp", "--setenv", "SQBOX_CACHE_DIR", POD_CACHE,
                 "--chdir", "/tmp"]
        if self.seccomp == "docker":
            argv += ["--ro-bind", self.seccomp_program, "/sqbox/seccomp.bpf"]
        program = "/sqbox/seccomp.bpf" if self.seccomp == "docker" else "-"
        userns = "userns" if self.user_namespaces else "nouserns"
        return argv + ["--", "/usr/bin/python3", "/sqbox/enter_pod.py", str(POD_UID), self.proc,
                       userns, program, *command]

    def run(self, *command, timeout=120, env=None):
        """Runs `command` in the pod; returns the CompletedProcess (text)."""
        argv = self._argv(command)
        if env:
            extra = []
            for key, value in env.items():
                extra += ["--setenv", key, value]
            argv = argv[:1] + extra + argv[1:]
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)

    def sqbox_run(self, image, *command, options=(), json_record=True, timeout=120, env=None):
        """`sqbox run` in the pod; returns (CompletedProcess, the --json record or None)."""
        record = "/work/record.json"
        record_host = Path(self.work) / "record.json"
        if record_host.exists():
            record_host.unlink()
        opts = list(options) + (["--json", record] if json_record else [])
        result = self.run(POD_BIN, "run", *opts, image, "--", *command, timeout=timeout, env=env)
        parsed = None
        if json_record and record_host.exists() and record_host.stat().st_size > 0:
            parsed = json.loads(record_host.read_text())
        return result, parsed


@pytest.fixture(scope="session")
def sqbox_bin():
    return test_inputs.executable_sqbox_binary()


@pytest.fixture(scope="session")
def busybox_image():
    return test_inputs.image("busybox")


@pytest.fixture(scope="session")
def docker_seccomp_program(tmp_path_factory):
    if not _bwrap():
        pytest.skip("bwrap not installed (package bubblewrap)")
    if not docker_seccomp.available():
        pytest.skip("libseccomp not installed (package libseccomp2)")
    testdata = os.environ.get("SQBOX_TESTDATA_DIR",
                              str(test_inputs.ROOT.parent / "shared" / "testdata"))
    profile = Path(testdata) / "docker-default-seccomp.json"
    assert profile.is_file(), f"{profile} missing (SQBOX_TESTDATA_DIR)"
    program = tmp_path_factory.mktemp("seccomp") / "docker-default.bpf"
    with open(program, "wb") as out:
        docker_seccomp.compile_profile(str(profile), out.fileno())
    assert program.stat().st_size > 0
    return str(program)


@pytest.fixture(scope="session")
def pod_images(tmp_path_factory, busybox_image):
    """A directory of images the pods see at POD_IMAGES (busybox.sqsh, and what tests add)."""
    directory = tmp_path_factory.mktemp("pod-images")
    shutil.copyfile(busybox_image, directory / "busybox.sqsh")
    # The pod's user is the test's user mapped to uid 1000: it can read what the test can.
    return directory


@pytest.fixture
def make_pod(sqbox_bin, pod_images, docker_seccomp_program, tmp_path):
    """make_pod(fuse=..., proc=..., seccomp=...) -> Pod, with a cache and work directory of its
    own (the cache is kept across calls in one test, so a second run can find it)."""
    cache = tmp_path / "cache"
    work = tmp_path / "work"
    cache.mkdir()
    work.mkdir()

    def make(**cell):
        return Pod(sqbox_bin, str(pod_images), str(cache), str(work),
                   seccomp_program=docker_seccomp_program, **cell)
    return make


def make_squashfs(source_dir, image_path, *extra):
    """mksquashfs SOURCE IMAGE (as enroot makes images: all files owned by root)."""
    mksquashfs = shutil.which("mksquashfs") or "/usr/bin/mksquashfs"
    if not os.access(mksquashfs, os.X_OK):
        pytest.skip("mksquashfs not installed (package squashfs-tools)")
    subprocess.run([mksquashfs, str(source_dir), str(image_path), "-noappend", "-quiet",
                    "-all-root", *extra], check=True, stdout=subprocess.DEVNULL)


def temporary_directory():
    return tempfile.mkdtemp(prefix="sqbox-pods-")

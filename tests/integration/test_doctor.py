"""`sqbox doctor`: on this machine every core check passes; with the real blockers of a pod applied
(bubblewrap builds them: no /dev/fuse, a masked /proc, a seccomp filter or a user-namespace limit
that denies user namespaces) it names each one, the fix, and says by its exit status whether
`sqbox run` works. See docs/doctor.md.
"""
import json
import os
import platform
import shutil
import struct
import subprocess
import tempfile

import pytest

RUN_WORKS = 0
RUN_FAILS = 1
BAD_USAGE = 125

# Checks that pass on any machine the suite runs on (the cgroup is root's only).
CORE_CHECKS = ["kernel", "user_namespaces", "seccomp", "fuse", "overlayfs", "proc", "landlock"]


def doctor(sqbox_bin, *args, prefix=(), timeout=60):
    return subprocess.run([*prefix, sqbox_bin, "doctor", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def doctor_json(sqbox_bin, *args, prefix=(), pass_fds=()):
    result = subprocess.run([*prefix, sqbox_bin, "doctor", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=60, pass_fds=pass_fds)
    report = json.loads(result.stdout)
    assert report["exit_code"] == result.returncode, result.stderr
    assert report["run_works"] == (result.returncode == RUN_WORKS)
    return result.returncode, {check["name"]: check for check in report["checks"]}


def needs_bwrap():
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (Debian package bubblewrap)")


def bwrap(*setup):
    """A pod-like outer sandbox: its own user namespace (as an unprivileged uid, so that sqbox
    inside does not take itself for root and want root's cgroup) and pid namespace, the host's
    files, and `setup` on top."""
    return ["bwrap", "--unshare-user", "--uid", "1234", "--gid", "1234", "--unshare-pid",
            "--die-with-parent", "--dev-bind", "/", "/", *setup]


def assert_all_fields(check):
    assert set(check) == {"name", "status", "found", "action", "fix"}
    assert check["found"] and check["action"]
    assert (check["fix"] == "") == (check["status"] == "ok"), check


def test_every_core_check_passes_here(sqbox_bin, busybox_image):
    status, checks = doctor_json(sqbox_bin, busybox_image)
    assert status == RUN_WORKS, checks
    for name in CORE_CHECKS + ["image"]:
        assert checks[name]["status"] == "ok", checks[name]
    for check in checks.values():
        assert_all_fields(check)
    assert checks["image"]["found"].startswith(busybox_image + ": squashfs 4.0, ")
    # A cgroup is root's (or --cgroup's); without one the limits are rlimits, as run -v says.
    if os.geteuid() == 0:
        assert checks["cgroup"]["status"] == "ok", checks["cgroup"]
    else:
        assert checks["cgroup"]["status"] == "degraded"
        assert "rlimits" in checks["cgroup"]["action"]
        assert "--cgroup DIR" in checks["cgroup"]["fix"]


def test_as_an_unprivileged_user(sqbox_bin, busybox_image):
    if os.geteuid() != 0:
        pytest.skip("runs as root only (scripts/test runs the whole suite as sqbox-test too)")
    user = "sqbox-test"
    access = subprocess.run(["runuser", "-u", user, "--", "test", "-x", sqbox_bin, "-a", "-r",
                             busybox_image])
    if access.returncode != 0:
        pytest.skip(f"{user} cannot reach {sqbox_bin} or the image (scripts/test stages them)")
    status, checks = doctor_json(sqbox_bin, busybox_image,
                                 prefix=["runuser", "-u", user, "--", "env", "-C", "/tmp"])
    assert status == RUN_WORKS, checks
    for name in CORE_CHECKS + ["image"]:
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["cgroup"]["status"] == "degraded"
    assert "falls back to rlimits" in checks["cgroup"]["action"]


def test_text_output_names_status_action_and_fix(sqbox_bin, tmp_path):
    garbage = tmp_path / "garbage.sqsh"
    garbage.write_bytes(os.urandom(8192))
    result = doctor(sqbox_bin, str(garbage))
    assert result.returncode == RUN_FAILS
    lines = result.stdout.splitlines()
    image = lines.index(next(line for line in lines if line.startswith("image: missing: ")))
    assert "not a squashfs image" in lines[image]
    assert lines[image + 1].startswith("    sqbox refuses the image")
    assert lines[image + 2].startswith("    fix: give a squashfs image")
    assert lines[-1] == "sqbox run does not work here"
    assert result.stderr == ""


def test_no_dev_fuse_is_degraded_with_the_unpacking_fallback(sqbox_bin, busybox_image):
    needs_bwrap()
    status, checks = doctor_json(sqbox_bin, busybox_image, prefix=bwrap("--dev", "/dev"))
    fuse = checks["fuse"]
    assert fuse["status"] == "degraded"
    assert "/dev/fuse: No such file or directory" in fuse["found"]
    assert "unpacks the image once into the cache" in fuse["action"]
    assert "device plugin" in fuse["fix"] and "--device /dev/fuse" in fuse["fix"]
    assert "unpacks it once into the cache" in checks["image"]["action"]
    assert checks["proc"]["status"] == "ok" and checks["user_namespaces"]["status"] == "ok"
    assert status == RUN_WORKS


def test_masked_proc_is_missing_with_the_pod_fix(sqbox_bin, busybox_image):
    needs_bwrap()
    # runc's masked paths: files of /proc with /dev/null bound over them.
    masks = [arg for path in ("/proc/timer_list", "/proc/sched_debug", "/proc/keys")
             if os.path.exists(path) for arg in ("--ro-bind", "/dev/null", path)]
    assert masks
    prefix = bwrap(*masks)
    status, checks = doctor_json(sqbox_bin, busybox_image, prefix=prefix)
    proc = checks["proc"]
    assert proc["status"] == "missing"
    assert "cannot mount /proc (proc): Operation not permitted" in proc["found"]
    assert "procMount: Unmasked" in proc["fix"] and "hostUsers: false" in proc["fix"]
    assert "--proc outer" in proc["action"]
    assert checks["user_namespaces"]["status"] == "ok"
    assert status == RUN_FAILS
    # Doctor's verdict is run's.
    run = subprocess.run([*prefix, sqbox_bin, "run", busybox_image, "--", "true"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert run.returncode == 125, run.stderr


# System call numbers and audit architectures for the filter below.
SECCOMP_ARCHES = {
    "x86_64": {"arch": 0xC000003E, "clone": 56, "unshare": 272, "clone3": 435},
    "aarch64": {"arch": 0xC00000B7, "clone": 220, "unshare": 97, "clone3": 435},
}


CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def deny_namespaces_filter(flags):
    """Classic BPF for bwrap --seccomp: clone and unshare with any of `flags` fail with EPERM and
    clone3 with ENOSYS, as Docker's and containerd's default profile have it for a process
    without CAP_SYS_ADMIN; everything else is allowed."""
    numbers = SECCOMP_ARCHES.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no system call numbers for {platform.machine()} in this test")
    ld_abs, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    eperm, enosys = 1, 38
    program = [
        (ld_abs, 0, 0, 4),                      # 0: arch
        (jeq, 0, 7, numbers["arch"]),           # 1: another arch: allow (9)
        (ld_abs, 0, 0, 0),                      # 2: system call number
        (jeq, 7, 0, numbers["clone3"]),         # 3: -> ENOSYS (11)
        (jeq, 2, 0, numbers["unshare"]),        # 4: -> flags (7)
        (jeq, 1, 0, numbers["clone"]),          # 5: -> flags (7)
        (ret, 0, 0, allow),                     # 6
        (ld_abs, 0, 0, 16),                     # 7: low half of the first argument
        (jset, 1, 0, flags),                    # 8: -> EPERM (10)
        (ret, 0, 0, allow),                     # 9
        (ret, 0, 0, errno | eperm),             # 10
        (ret, 0, 0, errno | enosys),            # 11
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# Docker's profile denies every namespace flag; a profile that allows user namespaces but not
# the others stops the sandbox as surely.
@pytest.mark.parametrize("flags", [CLONE_NEWUSER, CLONE_NEWNET], ids=["user", "network"])
def test_seccomp_denying_namespaces_is_named(sqbox_bin, busybox_image, flags):
    needs_bwrap()
    with tempfile.TemporaryFile() as program:
        program.write(deny_namespaces_filter(flags))
        program.seek(0)
        fd = program.fileno()
        prefix = bwrap("--seccomp", str(fd))
        status, checks = doctor_json(sqbox_bin, busybox_image, prefix=prefix, pass_fds=(fd,))
        program.seek(0)
        run = subprocess.run([*prefix, sqbox_bin, "run", busybox_image, "--", "true"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=60, pass_fds=(fd,))
    user_namespaces = checks["user_namespaces"]
    assert user_namespaces["status"] == "missing"
    assert "seccomp filter (Seccomp: 2" in user_namespaces["found"]
    assert "Operation not permitted" in user_namespaces["found"]
    assert "seccompProfile.type: Unconfined" in user_namespaces["fix"]
    step = "user namespace" if flags == CLONE_NEWUSER else "network and cgroup namespaces"
    assert step in user_namespaces["found"]
    assert "refuses to run" in user_namespaces["action"]
    assert "stays in force" in checks["seccomp"]["found"]
    for name in ("overlayfs", "proc"):
        assert checks[name]["status"] == "skipped"
    assert status == RUN_FAILS
    assert run.returncode == 125, run.stderr


def test_user_namespace_limit_is_named(sqbox_bin, busybox_image):
    needs_bwrap()
    prefix = bwrap("--disable-userns")
    status, checks = doctor_json(sqbox_bin, prefix=prefix)
    user_namespaces = checks["user_namespaces"]
    assert user_namespaces["status"] == "missing"
    assert "No space left on device" in user_namespaces["found"]
    assert "user.max_user_namespaces" in user_namespaces["fix"]
    assert status == RUN_FAILS
    run = subprocess.run([*prefix, sqbox_bin, "run", busybox_image, "--", "true"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert run.returncode == 125
    assert "sqbox doctor" in run.stderr


def test_leaves_no_cgroup_behind(sqbox_bin):
    # As root, the cgroup check makes the sandbox's cgroup (named after doctor's pid) and removes
    # it; an ordinary user gets none.
    process = subprocess.Popen([sqbox_bin, "doctor"], stdout=subprocess.DEVNULL)
    assert process.wait(timeout=60) in (RUN_WORKS, RUN_FAILS)
    prefix = f"sqbox-{process.pid}-"
    left = [os.path.join(parent, name) for parent, dirs, _ in os.walk("/sys/fs/cgroup")
            for name in dirs if name.startswith(prefix)]
    assert left == []


def test_bad_images(sqbox_bin, tmp_path):
    garbage = tmp_path / "garbage.sqsh"
    garbage.write_bytes(b"hsqs" + os.urandom(4092))
    missing = tmp_path / "missing.sqsh"
    for image, message in ((garbage, "image " + str(garbage) + ": "),
                           (missing, "No such file or directory")):
        status, checks = doctor_json(sqbox_bin, str(image))
        assert status == RUN_FAILS
        assert checks["image"]["status"] == "missing"
        assert message in checks["image"]["found"]
        assert "refuses the image" in checks["image"]["action"]
        run = subprocess.run([sqbox_bin, "run", str(image), "--", "true"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=60)
        assert run.returncode == 125
        assert checks["image"]["found"] in run.stderr
    # A FIFO is neither an image nor a directory, and must not hang doctor.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    status, checks = doctor_json(sqbox_bin, str(fifo))
    assert status == RUN_FAILS
    assert "neither a squashfs file nor a directory" in checks["image"]["found"]


def test_directory_image(sqbox_bin, tmp_path):
    status, checks = doctor_json(sqbox_bin, str(tmp_path))
    assert checks["image"]["status"] == "ok"
    assert checks["image"]["found"] == f"{tmp_path}: a directory"
    assert status == RUN_WORKS


def test_cgroup_option_that_is_no_delegated_cgroup(sqbox_bin, tmp_path):
    status, checks = doctor_json(sqbox_bin, "--cgroup", str(tmp_path))
    assert checks["cgroup"]["status"] == "missing"
    assert "not a cgroup v2 directory you can write" in checks["cgroup"]["found"]
    assert status == RUN_FAILS


def test_bad_option(sqbox_bin):
    result = doctor(sqbox_bin, "--no-such-option")
    assert result.returncode == BAD_USAGE
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1

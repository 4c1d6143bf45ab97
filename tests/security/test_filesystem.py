"""Escapes through the file system: host paths, the caller's home, writes outside the root,
symlinked --mount destinations, setuid and file-capability binaries, devices and /sys."""
import os
import pwd
import shutil
import time
import uuid
from pathlib import Path

import pytest



def test_host_file_is_unreachable_by_any_path(box, host_sentinel):
    """The sentinel (readable by the caller) through its own path, /proc/1/root, /proc/self/root
    with dot-dots, init's cwd and a /.. climb."""
    path = str(host_sentinel.file)
    result, res = box.py_results("""
        path = sys.argv[2]
        def read(p):
            with open(p) as f:
                return f.read()
        attempt("plain", read, path)
        attempt("dir_listing", os.listdir, os.path.dirname(path))
        attempt("proc_1_root", read, "/proc/1/root" + path)
        attempt("proc_self_root_dotdot", read, "/proc/self/root/../../.." + path)
        attempt("proc_1_cwd", read, "/proc/1/cwd/../../../.." + path)
        attempt("climb", read, "/../../../../.." + path)
        os.chdir("/")
        for _ in range(20):
            os.chdir("..")
        attempt("after_chdir_dotdot", read, "." + path)
        finish(cwd=os.getcwd())
    """, path)
    assert host_sentinel.secret not in result.stdout + result.stderr
    assert res == {"plain": "ENOENT", "dir_listing": "ENOENT", "proc_1_root": "EACCES",
                   "proc_self_root_dotdot": "ENOENT", "proc_1_cwd": "EACCES",
                   "climb": "ENOENT", "after_chdir_dotdot": "ENOENT", "cwd": "/"}, res


def _homes():
    homes = {pwd.getpwuid(os.getuid()).pw_dir}
    if os.environ.get("HOME"):
        homes.add(os.environ["HOME"])
    return sorted(h for h in homes if os.path.isdir(h))


def test_callers_home_is_not_visible(box, marker):
    """A file created in the caller's home for the test: not listed, not readable, not through
    /proc/1/root, and $HOME inside is not the caller's."""
    homes = _homes()
    writable = [h for h in homes if os.access(h, os.W_OK)]
    assert writable, f"cannot place a sentinel in the caller's home ({homes}): not writable"
    secret = "HOME-SECRET-" + uuid.uuid4().hex
    created = []
    try:
        for home in writable:
            path = Path(home) / f".{marker}"
            path.write_text(secret)
            created.append(path)
        result, res = box.py_results("""
            import glob
            for i, path in enumerate(sys.argv[2:]):
                home = os.path.dirname(path)
                try:
                    RESULTS[f"listed{i}"] = os.path.basename(path) in os.listdir(home)
                except OSError as e:
                    RESULTS[f"listed{i}"] = ename(e.errno)
                attempt(f"read{i}", lambda p: open(p).read(), path)
                attempt(f"via_init{i}", lambda p: open(p).read(), "/proc/1/root" + path)
            found = []
            for pattern in ("/home/*/.sqbox-sec-*", "/root/.sqbox-sec-*", "/*/.sqbox-sec-*"):
                found += glob.glob(pattern)
            finish(home=os.environ.get("HOME"), found=found)
        """, *[str(p) for p in created])
    finally:
        for path in created:
            path.unlink()
    assert secret not in result.stdout + result.stderr
    for i in range(len(created)):
        assert res[f"listed{i}"] in (False, "ENOENT"), res
        assert res[f"read{i}"] == "ENOENT", res
        assert res[f"via_init{i}"] == "EACCES", res
    assert res["found"] == []
    # Run as root, the sandbox user is root, whose HOME is the image's own /root: the same path
    # as the caller's home, a different directory (the listing and reads above show nothing of
    # the host's is there).
    assert res["home"] not in homes or (os.geteuid() == 0 and res["home"] == "/root"), res


def test_writes_never_reach_the_host(box, host_sentinel, marker):
    """Creating files in the sentinel directory through every path, and at / and /tmp inside:
    the host's sentinel directory, / and /tmp get nothing."""
    target = str(host_sentinel.dir)
    result, res = box.py_results("""
        marker, target = sys.argv[1], sys.argv[2]
        def create(p):
            with open(p, "w") as f:
                f.write("written from the sandbox")
        attempt("plain", create, f"{target}/{marker}")
        attempt("proc_1_root", create, f"/proc/1/root{target}/{marker}")
        attempt("proc_self_root", create, f"/proc/self/root/../..{target}/{marker}")
        attempt("symlink_to_init_root", os.symlink, "/proc/1/root", f"/tmp/{marker}-link")
        attempt("through_symlink", create, f"/tmp/{marker}-link{target}/{marker}")
        attempt("root_file", create, f"/{marker}")
        attempt("tmp_file", create, f"/tmp/{marker}")
        attempt("hardlink_proc", os.link, "/proc/self/exe", f"/tmp/{marker}-exe")
        # last: this one succeeds, inside the sandbox's own root
        attempt("mkdir", os.makedirs, f"{target}/subdir/{marker}")
        finish()
    """, target)
    assert result.returncode == 0, result.stderr
    assert res["plain"] == "ENOENT" and res["mkdir"] == "ok", res  # makedirs creates it inside
    assert res["proc_1_root"] == "EACCES" and res["proc_self_root"] == "ENOENT", res
    assert res["through_symlink"] == "EACCES", res
    assert res["root_file"] == "ok" and res["tmp_file"] == "ok", res  # inside the sandbox only
    assert res["hardlink_proc"] == "EXDEV", res
    for host_path in (Path("/") / marker, Path("/tmp") / marker, Path("/tmp") / f"{marker}-link",
                      host_sentinel.dir / marker, host_sentinel.dir / "subdir" / marker):
        assert not os.path.lexists(host_path), f"{host_path} appeared on the host"


def test_callers_environment_is_unreachable(box):
    """An API key in sqbox's own environment: not in the payload's, not in any /proc/*/environ
    the payload can read (init carries the caller's environment)."""
    secret = "sk-" + uuid.uuid4().hex
    env = dict(os.environ, SQBOX_SEC_API_KEY=secret)
    result, res = box.py_results("""
        seen = {}
        for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self", "1"]:
            try:
                seen[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
            except OSError as e:
                seen[pid] = ename(e.errno)
        finish(own=dict(os.environ), environs=seen)
    """, env=env)
    assert secret not in result.stdout + result.stderr
    assert "SQBOX_SEC_API_KEY" not in res["own"]
    assert res["environs"]["1"] == "EACCES", res["environs"]


def _hostile_rootfs(busybox_rootfs, dest):
    shutil.copytree(busybox_rootfs, dest, symlinks=True)
    return dest


@pytest.mark.parametrize("link", ["/", "../../../../../../../..", "SENTINEL", "etc/SENTINEL"],
                         ids=["to-root", "dotdot", "to-host-dir", "nested-to-host-dir"])
def test_mount_destination_through_a_symlink_is_refused(box, busybox_rootfs, host_sentinel,
                                                        tmp_path, marker, link):
    """A directory image whose /escape is a symlink out of the image: `--mount SRC:/escape/X`
    must fail with 125 and one stderr line, and create nothing on the host."""
    rootfs = _hostile_rootfs(busybox_rootfs, tmp_path / "rootfs")
    escape = rootfs / "escape"
    if link == "SENTINEL":
        os.symlink(str(host_sentinel.dir), escape)
    elif link == "etc/SENTINEL":
        os.symlink(str(host_sentinel.dir), rootfs / "etc" / "escape")
        escape = rootfs / "etc" / "escape"
    else:
        os.symlink(link, escape)
    source = tmp_path / "src"
    source.mkdir()
    (source / "payload").write_text("mounted")
    destination = "/" + str(escape.relative_to(rootfs)) + "/" + marker
    watched = [Path("/") / marker, host_sentinel.dir / marker]
    watched += [parent / marker for parent in rootfs.parents]
    try:
        result = box.run(str(rootfs), "sh", "-c", "cat /escape/*/payload", marker,
                         options=["--mount", f"{source}:{destination}"])
        assert result.returncode == 125, result
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("sqbox:"), result.stderr
        assert "symlink" in result.stderr
        assert "mounted" not in result.stdout
    finally:
        appeared = [p for p in watched if os.path.lexists(p)]
        for p in appeared:
            if p.is_dir():
                os.rmdir(p)
    assert appeared == [], f"created on the host: {appeared}"
    assert list(source.iterdir()) == [source / "payload"]


def test_nothing_runs_when_building_the_root_fails(box, busybox_rootfs, tmp_path):
    """sqbox starts the payload's process while init still builds the root, so that its own
    set-up (dropping privileges, loading the seccomp filter) overlaps with that. If building the
    root fails, the command must still never run. Here a writable host directory is mounted, then
    a refused mount (a destination through a symlink) fails the build; the command would leave a
    file in the directory, and prints to stdout."""
    rootfs = _hostile_rootfs(busybox_rootfs, tmp_path / "rootfs")
    os.symlink("/", rootfs / "escape")
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    source = tmp_path / "src"
    source.mkdir()
    for attempt in range(5):  # the payload's process and init race: try a few times
        result = box.run(str(rootfs), "sh", "-c", "touch /out/ran; echo ran", options=[
            "--mount", f"{out}:/out", "--mount", f"{source}:/escape/x"])
        assert result.returncode == 125, result
        assert result.stderr.count("\n") == 1 and "symlink" in result.stderr, result.stderr
        assert result.stdout == "", attempt
        assert list(out.iterdir()) == [], attempt


@pytest.mark.parametrize("destination", ["/../../../../MARKER", "/tmp/../../../MARKER",
                                         "/dev/../../MARKER"])
def test_mount_destination_with_dotdot_stays_inside(box, tmp_path, marker, destination):
    """`..` in a --mount destination either is refused or lands inside the sandbox's root."""
    destination = destination.replace("MARKER", marker)
    source = tmp_path / "src"
    source.mkdir()
    (source / "payload").write_text("mounted")
    try:
        result = box.sh(f"cat /{marker}/payload", options=["--mount", f"{source}:{destination}"])
        if result.returncode == 125:
            assert result.stderr.count("\n") == 1 and result.stderr.startswith("sqbox:")
        else:
            assert (result.returncode, result.stdout) == (0, "mounted"), result
    finally:
        leaked = os.path.lexists(Path("/") / marker)
        if leaked and os.path.isdir(Path("/") / marker):
            os.rmdir(Path("/") / marker)
    assert not leaked, f"/{marker} appeared on the host"


def _cap_xattr(caps):
    """A VFS_CAP_REVISION_2 security.capability value granting caps (effective)."""
    import struct
    low, high = caps & 0xFFFFFFFF, caps >> 32
    return struct.pack("<IIIII", 0x02000000 | 1, low, 0, high, 0)


@pytest.fixture
def setuid_rootfs(busybox_rootfs, attacks_dir, tmp_path):
    """A directory image with setuid helpers: owned by the caller always; when the tests run as
    root also owned by root, by an unmapped uid, and one with file capabilities."""
    rootfs = _hostile_rootfs(busybox_rootfs, tmp_path / "rootfs")
    helpers = rootfs / "suid"
    helpers.mkdir()
    names = []

    def install(name, uid=None, gid=None, mode=0o6755, xattr=None):
        path = helpers / name
        shutil.copyfile(attacks_dir / "setuid_probe", path)
        if uid is not None:
            os.chown(path, uid, gid)
        if xattr is not None:
            os.setxattr(path, "security.capability", xattr)
        path.chmod(mode)  # after chown, which clears the setuid bits
        names.append(name)

    install("own")
    if os.geteuid() == 0:
        install("root", 0, 0)
        install("unmapped", 4242, 4242)
        cap_sys_admin, cap_setuid, cap_dac_override = 21, 7, 1
        caps = (1 << cap_sys_admin) | (1 << cap_setuid) | (1 << cap_dac_override)
        install("filecaps", 0, 0, mode=0o755, xattr=_cap_xattr(caps))
    return rootfs, names


@pytest.mark.parametrize("as_root", [False, True], ids=["own-uid", "--root"])
def test_setuid_and_file_capability_binaries_grant_nothing(box, setuid_rootfs, marker, as_root):
    rootfs, names = setuid_rootfs
    script = "for p in /suid/*; do echo \"== $p\"; $p; done"
    options = ["--root"] if as_root else []
    result = box.run(str(rootfs), "sh", "-c", script, marker, options=options)
    assert result.returncode == 0, result.stderr
    inside_uid = 0 if as_root else os.geteuid()
    outputs = {}
    for chunk in result.stdout.split("== /suid/")[1:]:
        name, _, body = chunk.partition("\n")
        assert body.rstrip().endswith("done"), (name, body)
        outputs[name] = dict(line.split(" ", 1) for line in body.splitlines() if " " in line)
    assert sorted(outputs) == sorted(names), result.stdout
    for name, fields in outputs.items():
        ids = [int(fields[k]) for k in ("ruid", "euid", "suid")]
        assert ids == [inside_uid] * 3, (name, fields)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[cap], 16) == 0, (name, cap, fields[cap])
        assert fields["NoNewPrivs"] == "1", (name, fields)
        # setresuid(0,0,0) is a no-op for uid 0 inside; for anyone else it must be refused:
        # EPERM, or EINVAL where uid 0 has no mapping in the sandbox's user namespace.
        expected = ["0 0"] if inside_uid == 0 else ["-1 1", "-1 22"]
        assert fields["setresuid0"] in expected, (name, fields)
        assert fields["unshare_newns"] == "-1 1", (name, fields)
        assert fields["chroot"] == "-1 1", (name, fields)


def test_no_sysfs_no_host_devices_and_mknod_fails(box):
    result, res = box.py_results("""
        import stat
        sys_entries = os.listdir("/sys") if os.path.isdir("/sys") else []
        devices = []
        for dirpath, dirnames, filenames in os.walk("/dev"):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
                    kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
                    devices.append([os.path.join(dirpath, name), kind, os.major(st.st_rdev),
                                    os.minor(st.st_rdev)])
        attempt("mknod_block", os.mknod, "/tmp/sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))
        attempt("mknod_mem", os.mknod, "/tmp/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1))
        attempt("mknod_fifo", os.mknod, "/tmp/fifo", stat.S_IFIFO | 0o600)
        note("mount_sysfs", sysc(165, b"sysfs", b"/tmp", b"sysfs", 0, None))
        finish(sys=sys_entries, devices=devices)
    """)
    assert res["sys"] == []
    allowed = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)}
    for path, kind, major, minor in res["devices"]:
        assert kind == "c", f"block device {path} in the sandbox"
        assert (major, minor) in allowed or major == 136, f"device {path} {major}:{minor}"
    # EPERM (no CAP_MKNOD) or EACCES (a nodev mount): refused either way
    assert res["mknod_block"] in ("EPERM", "EACCES"), res
    assert res["mknod_mem"] in ("EPERM", "EACCES"), res
    assert res["mknod_fifo"] == "ok", res  # control: mknod itself works for a FIFO
    assert res["mount_sysfs"] == "EPERM", res


@pytest.mark.parametrize("kind", ["fifo", "huge", "directory"])
def test_hostile_etc_environment_fails_fast(box, busybox_rootfs, tmp_path, kind):
    """The image's /etc/environment is read before the payload's limits apply: a FIFO (open would
    block), a directory, or a file that would expand to gigabytes ends the run at once with 125
    and one line, and sqbox still answers SIGTERM meanwhile."""
    rootfs = _hostile_rootfs(busybox_rootfs, tmp_path / "rootfs")
    environment = rootfs / "etc" / "environment"
    if environment.exists():
        environment.unlink()
    if kind == "fifo":
        os.mkfifo(environment)
    elif kind == "directory":
        environment.mkdir()
    else:
        environment.write_text(("A=" + "$PATH" * 20000 + "\n") * 10)
    start = time.monotonic()
    result = box.run(str(rootfs), "echo", "never", options=["--timeout", "20"])
    assert time.monotonic() - start < 10
    assert result.returncode == 125, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "/etc/environment" in result.stderr, result.stderr

"""The sandbox user's /etc/passwd and /etc/group entries (runtime/sandbox_user.h) against hostile
images: symlinks aimed at host files or at /proc, an /etc that is a symlink, files too large or
not regular. sqbox reads the image's files inside the image's own root and writes the merged
ones into the sandbox's own layer: nothing of the host's is read into them, nothing is written
outside the sandbox, and the image never changes.
"""
import hashlib
import os
import pwd
import shutil
import subprocess

import pytest


def _squash(rootfs, image):
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    return str(image)


def _rootfs(busybox_rootfs, dest):
    shutil.copytree(busybox_rootfs, dest, symlinks=True)
    return dest


def _own_name():
    return pwd.getpwuid(os.geteuid()).pw_name


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("target", ["host", "oldroot", "proc"])
def test_a_symlinked_passwd_never_brings_host_files_in(box, busybox_rootfs, host_sentinel,
                                                       tmp_path, target):
    """The image's /etc/passwd and /etc/group point at a host file: by its host path, by the path
    sqbox's init sees the host under (/oldroot), and through /proc. sqbox resolves them inside
    the image (where they lead nowhere) and replaces them with files of its own."""
    link = {"host": str(host_sentinel.file), "oldroot": "/oldroot" + str(host_sentinel.file),
            "proc": "/proc/self/root" + str(host_sentinel.file)}[target]
    rootfs = _rootfs(busybox_rootfs, tmp_path / "rootfs")
    for name in ("passwd", "group"):
        (rootfs / "etc" / name).unlink()
        (rootfs / "etc" / name).symlink_to(link)
    image = _squash(rootfs, tmp_path / "image.sqsh")
    result = box.sh("id -un; id -gn; cat /etc/passwd /etc/group", image=image)
    assert result.returncode == 0, result.stderr
    assert host_sentinel.secret not in result.stdout + result.stderr
    user, group = result.stdout.splitlines()[:2]
    expected = "root" if os.geteuid() == 0 else _own_name()
    assert user == expected, result.stdout
    # A directory image the caller does not own keeps its symlink (sqbox cannot replace it
    # there), and still reads nothing of the host through it.
    directory = box.sh("cat /etc/passwd /etc/group; id -un", image=str(rootfs))
    assert host_sentinel.secret not in directory.stdout + directory.stderr


@pytest.mark.parametrize("target", ["oldroot", "host", "proc"])
def test_an_etc_symlink_is_refused_and_nothing_is_written_through_it(box, busybox_rootfs,
                                                                      host_sentinel, tmp_path,
                                                                      target):
    """/etc itself is a symlink to a host directory (as init sees it, or as the caller does) or
    into /proc: the run fails with one line and exit 125, and the host directory gets no
    passwd or group (the autouse fixture checks the sentinel directory is unchanged)."""
    rootfs = _rootfs(busybox_rootfs, tmp_path / "rootfs")
    shutil.rmtree(rootfs / "etc")
    (rootfs / "etc").symlink_to({"oldroot": "/oldroot" + str(host_sentinel.dir),
                                 "host": str(host_sentinel.dir), "proc": "/proc/self/cwd"}[target])
    for image in (str(rootfs), _squash(rootfs, tmp_path / "image.sqsh")):
        result = box.sh("cat /etc/passwd; echo ran", image=image)
        assert result.returncode == 125, (result.stdout, result.stderr)
        assert "ran" not in result.stdout
        assert result.stderr.count("\n") == 1 and "symlink" in result.stderr, result.stderr
        assert host_sentinel.secret not in result.stdout + result.stderr
    assert not (host_sentinel.dir / "passwd").exists()
    assert not (host_sentinel.dir / "group").exists()


@pytest.mark.parametrize("kind", ["huge-passwd", "huge-group", "fifo"])
def test_an_unreadable_account_file_fails_the_run_with_one_line(box, busybox_rootfs, tmp_path,
                                                                kind):
    """A /etc/passwd of more than 256 KiB (or a /etc/group), or a FIFO that would block: one line,
    exit 125, never a hang."""
    rootfs = _rootfs(busybox_rootfs, tmp_path / "rootfs")
    name = "group" if kind == "huge-group" else "passwd"
    (rootfs / "etc" / name).unlink()
    if kind == "fifo":
        os.mkfifo(rootfs / "etc" / name)
    else:
        line = "u{0}:x:{0}:{0}::/:/bin/sh\n" if name == "passwd" else "g{0}:x:{0}:\n"
        (rootfs / "etc" / name).write_text("".join(line.format(i) for i in range(20000)))
    image = _squash(rootfs, tmp_path / "image.sqsh")
    result = box.sh("echo ran", image=image)
    assert result.returncode == 125, (result.stdout, result.stderr)
    assert "ran" not in result.stdout
    assert result.stderr.count("\n") == 1 and f"/etc/{name}" in result.stderr, result.stderr


def test_passwd_changes_stay_in_the_sandbox(box, busybox_rootfs, tmp_path):
    """The payload rewrites /etc/passwd and /etc/group: neither the image (a .sqsh, a directory,
    an enroot container's layer) nor the next sandbox sees it."""
    rootfs = _rootfs(busybox_rootfs, tmp_path / "rootfs")
    image = tmp_path / "image.sqsh"
    _squash(rootfs, image)
    before = {"image": _digest(image), "passwd": _digest(rootfs / "etc" / "passwd"),
              "group": _digest(rootfs / "etc" / "group")}
    evil = "echo evil:x:0:0::/:/bin/sh > /etc/passwd && echo evil:x:0: > /etc/group && cat /etc/passwd"
    for target in (str(image), str(rootfs)):
        changed = box.sh(evil, image=target)
        assert changed.returncode == 0 and "evil" in changed.stdout, changed.stderr
        after = box.sh("cat /etc/passwd /etc/group", image=target)
        assert after.returncode == 0 and "evil" not in after.stdout, after.stdout
    assert before == {"image": _digest(image), "passwd": _digest(rootfs / "etc" / "passwd"),
                      "group": _digest(rootfs / "etc" / "group")}

    env = dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data"))

    def enroot(*args):
        return subprocess.run([box.binary, "enroot", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=60)

    assert enroot("create", "-n", "c", str(image)).returncode == 0
    # Without --rw the root is read-only; with it, the writes go to the bound files.
    assert "Read-only" in enroot("start", "c", "sh", "-c", evil).stderr
    started = enroot("start", "--rw", "c", "sh", "-c", evil)
    assert started.returncode == 0 and "evil" in started.stdout, started.stderr
    after = enroot("start", "c", "cat", "/etc/passwd", "/etc/group")
    assert "evil" not in after.stdout, after.stdout
    # The container's layer holds no account file of sqbox's (a --rw start binds them over).
    layer_files = [p for p in (tmp_path / "data").rglob("*") if p.name in ("passwd", "group")]
    for path in layer_files:
        assert path.stat().st_size == 0, (path, path.read_text())
    assert enroot("remove", "-f", "c").returncode == 0
    assert _digest(image) == before["image"]

"""Hostile image configuration: an image's /etc/fstab and /etc/environment, its symlinks, and an
enroot configuration script, try to reach the host. Each attempt must fail and leave the host as
it was.
"""
import ctypes
import os
import resource
import shutil
import subprocess

import pytest


def _rootfs_with(busybox_rootfs, dest, fstab=None, environment=None):
    shutil.copytree(busybox_rootfs, dest, symlinks=True)
    if fstab is not None:
        (dest / "etc" / "fstab").write_text(fstab)
    if environment is not None:
        (dest / "etc" / "environment").write_text(environment)
    return dest


# Each entry with the reason it must be refused for (so that each is refused by the check
# meant for it, not by an earlier one).
@pytest.mark.parametrize("entry, reason", [
    ("SENTINEL /loot none x-create=dir,bind", "refusing to mount host path"),
    ("SENTINEL /loot none x-create=dir,rbind,ro", "refusing to mount host path"),
    ("${ENROOT_ROOTFS}/../../../../../../../../SENTINEL /loot none x-create=dir,bind",
     "must not contain '..'"),
    ("${ENROOT_ROOTFS}/link-out /loot none x-create=dir,bind", "is a symlink in the sandbox"),
    ("/proc/1/root/SENTINEL /loot none x-create=dir,bind", "refusing to mount host path"),
    # Through the sandbox's own /proc: init's root, and the mounting process's own.
    ("${ENROOT_ROOTFS}/proc/1/root/SENTINEL /loot none x-create=dir,bind",
     "sqbox's own /proc mounts"),
    ("${ENROOT_ROOTFS}/proc/self/root/SENTINEL /loot none x-create=dir,bind",
     "sqbox's own /proc mounts"),
], ids=["host-bind", "host-rbind", "dotdot", "symlink-source", "proc-root", "rootfs-proc-1-root",
        "rootfs-proc-self-root"])
def test_image_fstab_cannot_mount_host_paths(box, busybox_rootfs, host_sentinel, tmp_path, entry,
                                             reason):
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs",
                          fstab=entry.replace("SENTINEL", str(host_sentinel.dir).lstrip("/")
                                              if "ROOTFS" in entry or "proc" in entry
                                              else str(host_sentinel.dir)) + "\n")
    os.symlink(str(host_sentinel.dir), rootfs / "link-out")
    result = box.sh("cat /loot/secret.txt; echo ran", image=str(rootfs))
    assert result.returncode == 125, (result.stdout, result.stderr)
    assert host_sentinel.secret not in result.stdout
    assert "ran" not in result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert reason in result.stderr, result.stderr


def test_image_fstab_cannot_mount_through_a_symlinked_target(box, busybox_rootfs, host_sentinel,
                                                             tmp_path):
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs",
                          fstab="tmpfs /escape/planted tmpfs x-create=dir\n")
    os.symlink(str(host_sentinel.dir), rootfs / "escape")
    result = box.sh("echo ran", image=str(rootfs))
    assert result.returncode == 125 and "symlink" in result.stderr
    assert not (host_sentinel.dir / "planted").exists()


@pytest.mark.parametrize("entry", [
    "${ENROOT_ROOTFS}/proc /unmasked none bind,x-create=dir",
    "${ENROOT_ROOTFS}/proc/sys /unmasked none rbind,x-create=dir",
    "${ENROOT_ROOTFS}/dev /unmasked none bind,x-create=dir",
    "none /proc/kcore none x-detach",
    "none /proc/sys none x-detach",
    "none /proc none x-detach",
    "none /dev none x-detach",
    "${ENROOT_ROOTFS}/proc/sys /unmasked none x-create=dir,x-move",
], ids=["bind-proc", "bind-proc-sys", "bind-dev", "kcore-mask", "proc-sys-ro", "proc", "dev",
        "move-proc-sys"])
def test_image_fstab_cannot_undo_sqbox_mounts(box, busybox_rootfs, tmp_path, entry):
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs", fstab=entry + "\n")
    result = box.sh("echo ran", image=str(rootfs))
    assert result.returncode == 125, (result.stdout, result.stderr)
    assert "refusing" in result.stderr and "ran" not in result.stdout


def test_image_environment_cannot_read_the_callers_variables(box, busybox_rootfs, tmp_path):
    """sqbox run substitutes ${VAR} in the image's /etc/environment from the sandbox's own
    variables only: an image cannot pull an API key out of the caller's environment."""
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs",
                          environment="LEAK=${SQBOX_TEST_API_KEY}\nLEAK2=$SQBOX_TEST_API_KEY\n")
    env = dict(os.environ, SQBOX_TEST_API_KEY="sk-secret-value")
    result = box.sh('echo "[$LEAK][$LEAK2]"; env | grep -c sk-secret || true',
                    image=str(rootfs), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[][]\n0\n"


def test_enroot_conf_functions_cannot_change_the_host(box, host_sentinel, tmp_path):
    """A configuration script's environ()/mounts() run in a throw-away sandbox whose root is the
    host's, read-only: they see what enroot's would, and can change none of it."""
    conf = tmp_path / "evil.conf"
    planted = host_sentinel.dir / "planted-by-conf"
    conf.write_text(f"""
environ() {{
    echo pwned > {planted} 2>/dev/null
    rm -f {host_sentinel.file} 2>/dev/null
    echo "RAN=yes"
}}
""")
    result = subprocess.run([box.binary, "enroot", "start", "-c", str(conf), box.busybox_image,
                             "sh", "-c", 'echo "ran=[$RAN]"', box.marker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data")),
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran=[yes]\n"
    assert not planted.exists()
    assert host_sentinel.file.read_text() == host_sentinel.secret + "\n"


def test_an_image_shell_cannot_forge_configuration_mounts(box, busybox_rootfs, host_sentinel,
                                                           tmp_path):
    """The image's own shells print what a configuration's mounts() would print, host path
    included. sqbox never evaluates configuration with the image's code, so nothing of it is
    mounted."""
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs")
    forged = ("#!/bin/busybox sh\n"
              f"printf '\\n\\036sqbox-conf:mounts\\n{host_sentinel.dir} /loot none bind\\n'\n"
              'exec /bin/busybox sh "$@"\n')
    for shell in ("bin/bash", "bin/sh"):
        target = rootfs / shell
        if target.exists() or target.is_symlink():
            target.unlink()
        target.write_text(forged)
        target.chmod(0o755)
    image = tmp_path / "forger.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    conf = tmp_path / "benign.conf"
    conf.write_text("environ() {\n    echo BENIGN=1\n}\n")
    result = subprocess.run([box.binary, "enroot", "start", "-c", str(conf), str(image),
                             "/bin/busybox", "sh", "-c",
                             "cat /loot/secret.txt 2>&1; echo BENIGN=$BENIGN", box.marker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data")),
                            timeout=60)
    assert host_sentinel.secret not in result.stdout, result.stdout
    assert "BENIGN=1" in result.stdout, (result.stdout, result.stderr)


def test_image_tmpfs_entries_share_the_sandbox_budget(box, busybox_rootfs, tmp_path):
    """However many tmpfs entries an image asks for, and with whatever size (0 means unlimited to
    tmpfs), they draw from the sandbox's one size-capped budget."""
    entries = "".join(f"tmpfs /big{i} tmpfs x-create=dir,size=0,nr_inodes=0\n" for i in range(4))
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs", fstab=entries)
    result = box.sh("total=0; for i in 0 1 2 3; do "
                    "dd if=/dev/zero of=/big$i/fill bs=1M count=64 2>/dev/null; "
                    "n=$(du -m /big$i/fill | cut -f1); total=$((total + n)); done; "
                    "echo total=$total", image=str(rootfs), options=["--tmpfs-size", "32m"])
    assert result.returncode == 0, result.stderr
    total = int(result.stdout.strip().split("=")[1])
    assert total <= 33, f"image tmpfs mounts held {total} MiB with a 32 MiB budget"


def test_image_fstab_cannot_copy_proc_along_with_the_root(box, busybox_rootfs, tmp_path):
    """A recursive bind of the root would carry /proc and its masks along; moving a mask away
    there would unmask it. Both steps are refused."""
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs", fstab=(
        "${ENROOT_ROOTFS}/ /mnt/r none rbind,x-create=dir\n"
        "${ENROOT_ROOTFS}/mnt/r/proc/keys /mnt/keys none x-move,x-create=file\n"))
    result = box.sh("echo ran", image=str(rootfs))
    assert result.returncode == 125 and "refusing" in result.stderr
    moved = _rootfs_with(busybox_rootfs, tmp_path / "moved", fstab=(
        "${ENROOT_ROOTFS}/ /mnt/r none bind,x-create=dir\n"
        "${ENROOT_ROOTFS}/proc/keys /mnt/keys none x-move,x-create=file\n"))
    result = box.sh("echo ran", image=str(moved))
    assert result.returncode == 125 and "ran" not in result.stdout


def test_image_fstab_cannot_reopen_a_read_only_root(box, busybox_rootfs, tmp_path):
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs",
                          fstab="${ENROOT_ROOTFS}/ /mnt/alias none bind,x-create=dir\n"
                                "${ENROOT_ROOTFS}/etc /etc none bind\n")
    result = box.sh("echo x > /mnt/alias/planted; echo y >> /etc/passwd; "
                    "test -e /planted && echo PLANTED; echo done",
                    image=str(rootfs), options=["--read-only"])
    assert "done" in result.stdout, result.stderr
    assert "PLANTED" not in result.stdout
    assert result.stderr.count("Read-only file system") == 2, result.stderr


def test_a_containers_layer_cannot_lead_sqbox_to_host_files(box, host_sentinel, tmp_path):
    """A --rw payload writes whatever it likes into its container's persistent layer, a host
    directory: symlinks to host files and directories, a FIFO, an unreadable directory. Listing,
    exporting and removing the container, done as the caller outside any sandbox, must neither
    follow them nor block on them."""
    env = dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data"))

    def enroot(*args):
        return subprocess.run([box.binary, "enroot", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=60)

    assert enroot("create", "-n", "evil", box.busybox_image).returncode == 0
    plant = enroot("start", "--rw", "evil", "sh", "-c",
                   f"ln -s {host_sentinel.dir} /to-dir; ln -s {host_sentinel.file} /to-file; "
                   "ln -s / /to-root; mkfifo /fifo; mkdir /locked; chmod 000 /locked; "
                   f"echo {box.marker}")
    assert plant.returncode == 0, plant.stderr
    assert enroot("list", "-f").returncode == 0
    image = tmp_path / "evil.sqsh"
    exported = enroot("export", "-o", str(image), "evil")
    assert exported.returncode == 0, exported.stderr
    assert host_sentinel.secret.encode() not in image.read_bytes()
    inside = box.run(str(image), "sh", "-c", "readlink /to-file; cat /to-file 2>&1; ls /to-dir")
    assert host_sentinel.secret not in inside.stdout
    assert inside.stdout.splitlines()[0] == str(host_sentinel.file)
    assert enroot("remove", "-f", "evil").returncode == 0
    assert host_sentinel.file.read_text() == host_sentinel.secret + "\n"


class _OpenWatch:
    """inotify on one host file: whether anyone opened or read it."""
    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        watch = libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_OPEN | self.IN_ACCESS)
        assert watch >= 0, os.strerror(ctypes.get_errno())

    def touched(self):
        try:
            return len(os.read(self.fd, 4096)) > 0
        except BlockingIOError:
            return False
        finally:
            os.close(self.fd)


def _image_pointing_at_host_file(busybox_rootfs, host_file, tmp_path):
    """An image whose /etc files, PATH candidates and a script's "#!" line lead to `host_file`:
    absolute symlinks, symlinks through /oldroot (where the supervisor and the image server see
    the host's root). Its command `planted` runs long enough for the look-ahead to be done."""
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs")
    targets = ["/oldroot" + str(host_file), str(host_file)]
    for index, name in enumerate(["fstab", "environment", "hosts", "hostname", "resolv.conf"]):
        (rootfs / "etc" / name).unlink(missing_ok=True)
        os.symlink(targets[index % 2], rootfs / "etc" / name)
    (rootfs / "usr" / "local" / "sbin").mkdir(parents=True, exist_ok=True)
    os.symlink(targets[0], rootfs / "usr" / "local" / "sbin" / "planted")
    os.symlink(targets[1], rootfs / "usr" / "local" / "sbin" / "planted-absolute")
    os.symlink(str(host_file.parent), rootfs / "usr" / "local" / "sbin" / "planted-directory")
    # An executable the sandbox cannot run (no such interpreter), so PATH search goes on.
    (rootfs / "usr" / "local" / "bin").mkdir(parents=True, exist_ok=True)
    (rootfs / "usr" / "local" / "bin" / "planted").write_text(f"#!{targets[0]}\n")
    (rootfs / "usr" / "local" / "bin" / "planted").chmod(0o755)
    # The command is found further along PATH, and runs long enough for the server to be done.
    (rootfs / "usr" / "bin" / "planted").write_text("#!/bin/sh\nsleep 0.5\necho ran\n")
    (rootfs / "usr" / "bin" / "planted").chmod(0o755)
    image = tmp_path / "planted.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    return image


def test_image_symlinks_do_not_make_the_image_server_open_host_files(box, busybox_rootfs,
                                                                      host_sentinel, tmp_path):
    """The supervisor looks up, and the image server reads ahead, through their own view of the
    filesystem (where the host's root is /oldroot), what the sandbox needs first: the image's /etc
    files, the command along PATH and the interpreter it names. Those are symlinks to a host file
    here, absolute and through /oldroot, and a script whose "#!" names it; resolved as in the
    sandbox they lead nowhere, and the host file is never even opened."""
    image = _image_pointing_at_host_file(busybox_rootfs, host_sentinel.file, tmp_path)
    watch = _OpenWatch(host_sentinel.file)
    result = box.run(str(image), "planted")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert not watch.touched()


def test_an_image_that_lies_about_a_symlinks_size_costs_nothing(box, busybox_rootfs, tmp_path):
    """Sizes in an image are the image's word. A symlink that claims 4 GiB of target must not have
    sqbox allocate that when the payload reads it or looks up through it: bounded like the kernel
    bounds a symlink, the run goes on, under an address-space limit that such an allocation would
    break (1 GiB)."""
    rootfs = _rootfs_with(busybox_rootfs, tmp_path / "rootfs")
    target = b"/sqbox-symlink-size-probe"
    os.symlink(target.decode(), rootfs / "etc" / "sqbox")
    image = tmp_path / "lying-symlink.sqsh"
    # -noI: inodes stored as they are, so the symlink's size field can be found and changed.
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress", "-noI"], check=True, stdout=subprocess.DEVNULL)
    data = bytearray(image.read_bytes())
    at = data.find(target)
    assert at > 4 and data.count(target) == 1
    assert int.from_bytes(data[at - 4:at], "little") == len(target)
    data[at - 4:at] = (0xFFFFFFF0).to_bytes(4, "little")
    image.write_bytes(bytes(data))
    env = dict(os.environ, SQBOX_CACHE_DIR=str(tmp_path / "cache"))

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    for _ in range(2):
        # --memory below the limit: unprivileged, it is an address-space limit too.
        result = box.run(str(image), "sh", "-c",
                         "readlink /etc/sqbox; cat /etc/sqbox/warm-up; echo ran",
                         options=["--memory", "512M"], env=env, preexec_fn=limit_memory)
        assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr

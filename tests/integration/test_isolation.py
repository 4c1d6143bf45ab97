"""What the payload can see and reach: processes, files, network, identity."""
import hashlib
import os
import socket
import subprocess
import threading

import pytest


def test_only_sandbox_processes_are_visible(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "ls -d /proc/[0-9]* | wc -l; cat /proc/1/status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # init, sh, and the subshells of the pipeline: never the host's hundreds of processes.
    assert int(lines[0]) <= 5
    assert "Pid:\t1" in result.stdout


def test_host_processes_cannot_be_signalled(sqbox, busybox_image):
    host_pid = os.getpid()
    result = sqbox.run(busybox_image, "sh", "-c", f"kill -0 {host_pid} 2>&1; echo status=$?")
    # The sandbox ran, and the host's pid names no process in it.
    assert result.returncode == 0, result.stderr
    assert "No such process" in result.stdout and "status=1" in result.stdout, result.stdout


def test_hostname_and_uts(sqbox, busybox_image):
    assert sqbox.run(busybox_image, "hostname").stdout == "sandbox\n"
    assert sqbox.run(busybox_image, "cat", "/etc/hostname").stdout == "sandbox\n"
    assert sqbox.run(busybox_image, "hostname", options=["--hostname", "box7"]).stdout == "box7\n"


def test_user_mapping(sqbox, busybox_image):
    uid, gid = os.geteuid(), os.getegid()
    result = sqbox.run(busybox_image, "sh", "-c", "id -u; id -g; cat /proc/self/uid_map")
    lines = result.stdout.split()
    assert lines[:2] == [str(uid), str(gid)]
    assert lines[2:] == [str(uid), str(uid), "1"]
    result = sqbox.run(busybox_image, "sh", "-c", "id -u; cat /proc/self/uid_map", options=["--root"])
    assert result.stdout.split() == ["0", "0", str(uid), "1"]


def test_no_capabilities_and_no_new_privs(sqbox, busybox_image):
    for options in ([], ["--root"]):
        status = sqbox.run(busybox_image, "cat", "/proc/self/status", options=options).stdout
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[name], 16) == 0, (options, name, fields[name])
        assert fields["NoNewPrivs"].strip() == "1"


def test_host_files_are_absent(sqbox, busybox_image, tmp_path):
    marker = tmp_path / "host-marker"
    marker.write_text("secret")
    result = sqbox.run(busybox_image, "sh", "-c",
                       f"cat {marker}; ls /oldroot /home /work 2>&1; cat /etc/shadow; "
                       "grep -c . /proc/self/mountinfo")
    assert "secret" not in result.stdout
    assert "/oldroot" not in result.stdout.replace("ls: /oldroot", "")
    # Only the sandbox's own mounts: root, proc (+ its masks), dev (+6 devices, pts, shm), tmp.
    assert int(result.stdout.split()[-1]) <= 12 + len(PROC_MASKS)


# What sqbox mounts over parts of /proc (those this kernel has), see src/runtime/proc_masks.cpp.
PROC_MASKS = {f"/proc/{name}" for name in (
    "kcore", "kallsyms", "keys", "key-users", "timer_list", "timer_stats", "sched_debug",
    "latency_stats", "kmsg", "modules", "vmallocinfo", "iomem", "ioports", "kpagecount",
    "kpageflags", "kpagecgroup", "slabinfo", "config.gz", "acpi", "asound", "scsi", "driver",
    "dynamic_debug", "sys", "sysrq-trigger", "irq", "bus", "fs")}


def test_mountinfo_shows_no_host_paths(sqbox, busybox_image):
    mountinfo = sqbox.run(busybox_image, "cat", "/proc/self/mountinfo").stdout
    mount_points = {line.split()[4] for line in mountinfo.splitlines()}
    assert mount_points <= {"/", "/proc", "/dev", "/dev/null", "/dev/zero", "/dev/full",
                            "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts", "/dev/shm",
                            "/tmp"} | PROC_MASKS


def test_dev_has_only_harmless_devices(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c",
                       "ls /dev; echo x > /dev/null && head -c 4 /dev/urandom | wc -c; "
                       "echo y > /dev/shm/f && cat /dev/shm/f; touch /dev/new 2>&1")
    listing = result.stdout.split()
    for forbidden in ("sda", "vda", "kmsg", "mem", "fuse", "console", "loop0"):
        assert forbidden not in listing
    assert "4" in listing and "y" in listing
    assert "Read-only file system" in result.stdout


def test_no_sysfs_from_the_host(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "ls -A /sys | wc -l")
    assert result.stdout.strip() == "0"


def test_network_is_loopback_only(sqbox, python_image):
    script = ("import os\n"
              "print(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') "
              "else 'nosys')\n"
              "print([l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])\n")
    result = sqbox.run(python_image, "python3", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "['lo']"


def test_host_loopback_services_are_unreachable(sqbox, python_image):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        server.settimeout(10)
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    script = (f"import socket\n"
              f"try:\n"
              f"    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')\n"
              f"except OSError as e:\n"
              f"    print('refused', type(e).__name__)\n")
    result = sqbox.run(python_image, "python3", "-c", script)
    server.close()
    thread.join()
    assert result.stdout.startswith("refused"), result.stdout + result.stderr
    assert not accepted


def test_loopback_inside_works(sqbox, python_image):
    script = ("import socket\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
              "c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n"
              "c.sendall(b'ping'); print(a.recv(4).decode())\n")
    assert sqbox.run(python_image, "python3", "-c", script).stdout == "ping\n"


def test_writes_vanish_and_the_image_is_untouched(sqbox, busybox_image):
    digest = hashlib.sha256(open(busybox_image, "rb").read()).hexdigest()
    first = sqbox.run(busybox_image, "sh", "-c",
                      "echo changed > /etc/passwd && echo new > /root/file && rm /bin/ls && "
                      "cat /etc/passwd /root/file")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "changed\nnew\n"
    second = sqbox.run(busybox_image, "sh", "-c", "cat /root/file; grep -c root /etc/passwd; ls / >/dev/null && echo ls-ok")
    assert "new" not in second.stdout
    assert second.stdout.splitlines()[-2:] == ["1", "ls-ok"]
    assert hashlib.sha256(open(busybox_image, "rb").read()).hexdigest() == digest


def test_read_only_root_keeps_tmp_writable(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c",
                       "touch /etc/x 2>&1; echo ok > /tmp/f && cat /tmp/f",
                       options=["--read-only"])
    assert "Read-only file system" in result.stdout
    assert result.stdout.endswith("ok\n")


def test_tmpfs_size_caps_writes(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c",
                       "dd if=/dev/zero of=/tmp/big bs=1M count=64 2>&1; "
                       "dd if=/dev/zero of=/root/big bs=1M count=64 2>&1",
                       options=["--tmpfs-size", "16M"])
    assert result.stdout.count("No space left on device") == 2


def test_bind_mounts(sqbox, busybox_image, tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "input.txt").write_text("input")
    out = tmp_path / "out"
    out.mkdir()
    single = tmp_path / "single.txt"
    single.write_text("one file")
    result = sqbox.run(busybox_image, "sh", "-c",
                       "cat /work/input.txt; echo; touch /work/x 2>&1; echo result > /out/r; "
                       "cat /deep/new/dir/single.txt",
                       options=["--mount", f"{task}:/work:ro", "--mount", f"{out}:/out",
                                "--mount", f"{single}:/deep/new/dir/single.txt:ro"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("input\n")
    assert "Read-only file system" in result.stdout
    assert result.stdout.endswith("one file")
    assert (out / "r").read_text() == "result\n"
    assert not (task / "x").exists()


def test_mount_destination_through_a_symlink_is_refused(sqbox, busybox_image, tmp_path):
    # busybox's /bin/sh is a symlink in the image
    result = sqbox.run(busybox_image, "true", options=["--mount", f"{tmp_path}:/bin/sh/x"])
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1
    assert "/bin/sh is a symlink" in result.stderr


def test_symlink_escape_in_a_directory_image_is_refused(sqbox, busybox_image, tmp_path):
    import subprocess
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL)
    os.symlink("/../../../../" + str(tmp_path), rootfs / "escape")
    target = tmp_path / "victim"
    target.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    result = sqbox.run(str(rootfs), "true", options=["--mount", f"{src}:/escape/victim/m"])
    assert result.returncode == 125
    assert "symlink" in result.stderr
    assert list(target.iterdir()) == []


def test_init_is_closed_to_the_payload(sqbox, busybox_image):
    """Init runs sqbox's own binary inside the sandbox: its exe, memory, fds and environment
    must stay out of the payload's reach even though both have the same uid."""
    result = sqbox.run(busybox_image, "sh", "-c",
                       "readlink /proc/1/exe || echo exe-denied; "
                       "cat /proc/1/environ >/dev/null 2>&1 || echo environ-denied; "
                       "readlink /proc/1/fd/2 >/dev/null 2>&1 || echo fd-denied; "
                       "kill -9 1; sleep 0.2; grep -q '^State:' /proc/1/status && echo init-alive")
    assert result.stdout.split() == ["exe-denied", "environ-denied", "fd-denied", "init-alive"]


def test_descriptors_leaked_into_sqbox_do_not_reach_the_payload(sqbox, busybox_image, tmp_path):
    """runc CVE-2024-21626 style: an fd the caller leaks (here one open on a host directory)."""
    secret_dir = tmp_path / "host-dir"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("host secret")
    opened = os.open(secret_dir, os.O_RDONLY | os.O_DIRECTORY)
    leaked = os.dup2(opened, 42, inheritable=True)
    os.close(opened)
    try:
        result = sqbox.run(busybox_image, "sh", "-c",
                           "ls /proc/self/fd; cat /proc/self/fd/42/secret 2>&1",
                           pass_fds=(leaked,))
    finally:
        os.close(leaked)
    assert "host secret" not in result.stdout
    lines = result.stdout.splitlines()
    # ls itself holds one descriptor (3) on /proc/self/fd while listing it.
    assert lines[:4] == ["0", "1", "2", "3"]
    assert "42" not in lines


def test_image_environment_symlink_is_not_followed(sqbox, busybox_image, tmp_path):
    """A hostile image pointing /etc/environment at init's environment (the caller's) must not
    get the caller's variables into the payload."""
    import subprocess
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL)
    (rootfs / "etc" / "environment").unlink()
    os.symlink("/proc/1/environ", rootfs / "etc" / "environment")
    # The secret first: a NUL-separated environ parsed as one line would yield its first entry.
    env = {"AAA_SQBOX_SECRET": "api-key-456", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    result = sqbox.run(str(rootfs), "env", env=env)
    assert result.returncode == 0, result.stderr
    assert "api-key-456" not in result.stdout


GENERATED_ETC = {
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "resolv.conf": "# sqbox: no network but loopback in this sandbox\n",
}
SHOW_ETC = ("for f in hostname hosts resolv.conf; do cat /etc/$f; done; echo ==;"
            "cat /etc/fstab | md5sum; ls -a /etc | md5sum; stat -c '%a %u' /etc; echo ==;")


def _etc_variant_image(tmp_path, busybox_image, variant):
    """The busybox image with its /etc changed as `variant` says, as a .sqsh."""
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-no-xattrs", "-d", str(rootfs), busybox_image],
                   check=True, stdout=subprocess.DEVNULL)
    etc = rootfs / "etc"
    if variant == "symlinks":  # the image's files are symlinks: replaced, never followed
        for name in GENERATED_ETC:
            (etc / name).unlink(missing_ok=True)
            os.symlink("fstab" if name == "hosts" else "/etc/environment", etc / name)
    elif variant == "missing":
        for name in GENERATED_ETC:
            (etc / name).unlink(missing_ok=True)
    image = tmp_path / f"{variant}.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    return image, rootfs


@pytest.mark.parametrize("variant", ["plain", "symlinks", "missing"])
def test_generated_etc_files_replace_the_images(sqbox, busybox_image, tmp_path, variant):
    """/etc/hostname, hosts and resolv.conf are sqbox's, whatever the image has there; the rest
    of /etc is the image's; in a writable root they are ordinary files the payload may change,
    rename and delete; and --read-only shows the same files, unwritable."""
    image, rootfs = _etc_variant_image(tmp_path, busybox_image, variant)
    real_etc = (rootfs / "etc").resolve()
    expected_generated = "".join(GENERATED_ETC[name] for name in
                                 ("hostname", "hosts", "resolv.conf"))
    result = sqbox.run(str(image), "sh", "-c", SHOW_ETC +
                       "echo more >> /etc/hosts && mv /etc/hostname /etc/renamed &&"
                       " rm /etc/resolv.conf && tail -1 /etc/hosts && cat /etc/renamed &&"
                       " ls /etc/hostname /etc/resolv.conf 2>&1 | wc -l")
    assert result.returncode == 0, result.stderr
    generated, listing, changed = result.stdout.split("==\n")
    assert generated == expected_generated
    # (/etc/passwd and /etc/group are the image's merged with the sandbox user's entries:
    # tests/python/test_sandbox_user.py.)
    fstab_md5, names_md5, etc_mode = listing.splitlines()
    assert fstab_md5.split()[0] == hashlib.md5((real_etc / "fstab").read_bytes()).hexdigest()
    names = sorted({".", "..", *os.listdir(real_etc), *GENERATED_ETC})
    assert names_md5.split()[0] == hashlib.md5(("\n".join(names) + "\n").encode()).hexdigest()
    assert etc_mode == f"{real_etc.stat().st_mode & 0o7777:o} {os.geteuid()}"
    assert changed == "more\nsandbox\n2\n"
    # The image's own files (what the symlinks point at) are untouched.
    unchanged = sqbox.run(str(image), "sh", "-c", "md5sum /etc/fstab /etc/environment")
    assert unchanged.returncode == 0, unchanged.stderr
    for line in unchanged.stdout.splitlines():
        digest, path = line.split()
        assert digest == hashlib.md5((real_etc / os.path.basename(path)).read_bytes()).hexdigest()

    sealed = sqbox.run(str(image), "sh", "-c", SHOW_ETC + "echo x >> /etc/hosts && echo wrote",
                       options=["--read-only"])
    assert sealed.stdout.split("==\n")[0] == expected_generated
    assert "wrote" not in sealed.stdout


def test_an_image_whose_etc_is_a_symlink_is_refused(sqbox, busybox_image, tmp_path):
    """sqbox writes /etc/hosts and friends: a symlinked /etc could point them anywhere."""
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-no-xattrs", "-d", str(rootfs), busybox_image],
                   check=True, stdout=subprocess.DEVNULL)
    (rootfs / "etc").rename(rootfs / "usr" / "etc")
    os.symlink("usr/etc", rootfs / "etc")
    image = tmp_path / "etc-symlink.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    result = sqbox.run(str(image), "true")
    assert result.returncode == 125
    assert result.stderr == "sqbox: /etc: /etc is a symlink in the sandbox; refusing to follow it\n"

"""An image's learned warm-up list: `sqbox run --learn-warm-up` records what its payload looked up,
read and listed in a .sqsh image; later runs look those names up ahead of their payload (and
unpack the files it reads: test_unpacked_files.py). Only a learning run ever writes a list."""
import os
import re
import stat
from pathlib import Path

import pytest


def cache_env(tmp_path):
    return dict(os.environ, SQBOX_CACHE_DIR=str(tmp_path / "cache"))


def list_path(sqbox, image, env):
    """The list's path, as `--verbose` reports it."""
    result = sqbox.run(image, "true", options=["--verbose"], env=env)
    assert result.returncode == 0, result.stderr
    found = re.search(r"warm-up: (?:no list for this image yet \((\S+);|\d+ names from (\S+))",
                      result.stderr)
    assert found, result.stderr
    return Path(found.group(1) or found.group(2))


def read_list(path):
    data = path.read_bytes()
    header = b"sqbox-warm-up 1\n"
    assert data.startswith(header)
    records = data[len(header):].split(b"\0")
    assert records[-1] == b""
    return [(chr(r[0]), r[1:].decode()) for r in records[:-1]]


def write_list(path, entries):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"sqbox-warm-up 1\n" +
                     b"".join(kind.encode() + name.encode() + b"\0" for kind, name in entries))


def test_learning_records_what_the_payload_looked_up_read_and_listed(sqbox, busybox_image,
                                                                    tmp_path):
    env = cache_env(tmp_path)
    result = sqbox.run(busybox_image, "sh", "-c",
                       "cat /etc/passwd >/dev/null; ls /usr/sbin >/dev/null; "
                       "test -e /no-such-name || echo done",
                       options=["--learn-warm-up"], env=env)
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    path = list_path(sqbox, busybox_image, env)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and re.fullmatch(
        rf"sqbox: warm-up list of {re.escape(busybox_image)}: (\d+) names \(\1 new\), "
        rf"saved in {re.escape(str(path))}", lines[0]), result.stderr
    entries = read_list(path)
    assert ("R", "/etc/passwd") in entries
    assert ("D", "/usr/sbin") in entries
    assert ("L", "/no-such-name") in entries   # missing names too: the kernel caches those
    assert ("L", "/etc") in entries
    # In the order first used: the directory before the file in it.
    assert entries.index(("L", "/etc")) < entries.index(("R", "/etc/passwd"))
    assert len(entries) == len(set(name for _, name in entries))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # No temporary file left; the plain run that found the list unpacked the file it reads.
    assert sorted(os.listdir(path.parent)) == [".lock", path.name, path.name + ".files"]


def test_a_plain_run_never_writes_a_list(sqbox, busybox_image, tmp_path):
    """A run's payload is not trusted: what it looks up must not reach later sandboxes."""
    env = cache_env(tmp_path)
    payload = "cat /etc/group >/dev/null; ls /var >/dev/null; test -e /planted-name; echo ok"
    result = sqbox.run(busybox_image, "sh", "-c", payload, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")
    # Only the image's entry (what it carries, here nothing: test_unpacked_files.py), no list.
    assert [p.name for p in (tmp_path / "cache" / "warm-up").glob("*")
            if not p.name.endswith(".files")] == [".lock"]

    learned = sqbox.run(busybox_image, "true", options=["--learn-warm-up"], env=env)
    assert learned.returncode == 0, learned.stderr
    path = list_path(sqbox, busybox_image, env)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    result = sqbox.run(busybox_image, "sh", "-c", payload, env=env)
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert ("L", "/planted-name") not in read_list(path)


def test_runs_look_up_the_list_ahead_of_the_payload(sqbox, busybox_image, tmp_path):
    """The warm-up goes through the image server like the payload would: a learning run whose
    payload never touches /var still has the server see /var and /var/tmp looked up, on the way
    to a name of the list. Without the list (--no-warm-up), it does not."""
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    write_list(path, [("L", "/var/tmp/listed-name")])
    result = sqbox.run(busybox_image, "true", options=["--learn-warm-up", "--no-warm-up"],
                       env=env)
    assert result.returncode == 0, result.stderr
    names = [name for _, name in read_list(path)]
    assert names[0] == "/var/tmp/listed-name"  # kept: a learning run adds, never drops
    assert "/var" not in names and "/var/tmp" not in names, names

    result = sqbox.run(busybox_image, "true", options=["--learn-warm-up", "--verbose"], env=env)
    assert result.returncode == 0, result.stderr
    assert f"warm-up: {len(names)} names from {path}" in result.stderr
    entries = read_list(path)
    assert ("L", "/var") in entries and ("L", "/var/tmp") in entries, entries


def test_a_file_that_is_not_a_list_is_ignored_then_replaced(sqbox, busybox_image, tmp_path):
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"sqbox-warm-up 1\nL/etc\0R/cut sh")
    result = sqbox.run(busybox_image, "echo", "fine", options=["--verbose"], env=env)
    assert (result.returncode, result.stdout) == (0, "fine\n"), result.stderr
    assert f"warm-up: {path} is not a warm-up list; ignored" in result.stderr
    assert path.read_bytes() == b"sqbox-warm-up 1\nL/etc\0R/cut sh"

    result = sqbox.run(busybox_image, "cat", "/etc/passwd", options=["--learn-warm-up"], env=env)
    assert result.returncode == 0, result.stderr
    assert ("R", "/etc/passwd") in read_list(path)


def test_learning_needs_a_squashfs_image(sqbox, tmp_path):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    result = sqbox.run(str(rootfs), "true", options=["--learn-warm-up"], env=cache_env(tmp_path))
    assert result.returncode == 125
    assert result.stderr == (f"sqbox: --learn-warm-up: {rootfs} is a directory; warm-up lists "
                             "are for .sqsh images\n")
    assert not (tmp_path / "cache").exists()


def test_lists_are_kept_only_in_a_private_directory(sqbox, busybox_image, tmp_path):
    """A directory others can write is not trusted with lists: they could swap them."""
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    learned = sqbox.run(busybox_image, "true", options=["--learn-warm-up"], env=env)
    assert learned.returncode == 0, learned.stderr
    path.parent.chmod(0o777)
    before = path.read_bytes()
    result = sqbox.run(busybox_image, "echo", "ok", options=["--verbose"], env=env)
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr
    assert (f"warm-up: {path.parent} is not a directory of yours that only you can write; "
            "warm-up lists are kept only in such a directory; no list used") in result.stderr
    result = sqbox.run(busybox_image, "cat", "/etc/group", options=["--learn-warm-up"], env=env)
    assert result.returncode == 125
    assert result.stderr.endswith(f"sqbox: {path.parent} is not a directory of yours that only "
                                  "you can write; warm-up lists are kept only in such a "
                                  "directory\n"), result.stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize("blocker", ["file-in-the-way", "list-is-a-directory"])
def test_a_list_that_cannot_be_saved_fails_the_learning_run(sqbox, busybox_image, tmp_path,
                                                            blocker):
    env = cache_env(tmp_path)
    cache = tmp_path / "cache"
    if blocker == "file-in-the-way":
        cache.write_text("in the way")
    else:
        path = list_path(sqbox, busybox_image, env)
        (path / "occupied").mkdir(parents=True)
    result = sqbox.run(busybox_image, "echo", "ran", options=["--learn-warm-up"], env=env)
    assert result.stdout == "ran\n"
    assert result.returncode == 125
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sqbox: cannot ") and str(cache) in lines[0], \
        result.stderr
    if blocker == "list-is-a-directory":
        # No temporary file (the entry is from the plain run that found where the list goes).
        assert sorted(os.listdir(cache / "warm-up")) == [".lock", path.name,
                                                          path.name + ".files"]


def test_a_learning_runs_payload_gets_no_descriptor_of_the_record(sqbox, busybox_image,
                                                                   tmp_path):
    """The image server's record file stays with the server: init closes its copy first thing,
    and the payload has only its stdio (and the descriptor `ls` opens to list)."""
    result = sqbox.run(busybox_image, "ls", "-l", "/proc/self/fd/",
                       options=["--learn-warm-up"], env=cache_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "sqbox-warm-up" not in result.stdout and "memfd" not in result.stdout, result.stdout
    # "lr-x------ 1 user group 64 Nov 21 17:49 3[ -> target]": the ninth field.
    descriptors = sorted(int(line.split()[8]) for line in result.stdout.splitlines()
                         if line.startswith("l"))
    assert descriptors == [0, 1, 2, 3], result.stdout


def test_a_learning_run_that_times_out_ends_on_time_and_keeps_what_it_saw(sqbox, busybox_image,
                                                                         tmp_path):
    env = cache_env(tmp_path)
    result = sqbox.run(busybox_image, "sh", "-c", "cat /etc/passwd >/dev/null; sleep 30",
                       options=["--learn-warm-up", "--timeout", "1"], env=env, timeout=20)
    assert result.returncode == 124, result.stderr
    assert ("R", "/etc/passwd") in read_list(list_path(sqbox, busybox_image, env))

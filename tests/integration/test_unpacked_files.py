"""The files a warm-up list reads, unpacked once per image into the caller's cache and laid above
the image: what the sandbox sees does not change, the tree is made once per image file and list,
and never by a learning run."""
import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

# Prints, for each path: type and permission bits, owner, size (files), modification time, link
# count (files), and a digest of the contents or the sorted names of a directory.
DESCRIBE = r"""
import hashlib, os, sys
for path in sys.argv[1:]:
    st = os.stat(path)
    if os.path.isdir(path):
        what = hashlib.sha256("/".join(sorted(os.listdir(path))).encode()).hexdigest()[:16]
        print(path, oct(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, what)
    else:
        what = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
        print(path, oct(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
              st.st_nlink, what)
"""


def cache_env(tmp_path):
    return dict(os.environ, SQBOX_CACHE_DIR=str(tmp_path / "cache"))


def unpacked(stderr):
    """(files, made, tree) from a --verbose run's line about unpacked files, or None."""
    found = re.search(r"warm-up: (\d+) files \(\d+ bytes\) (unpacked in|from) (\S+)", stderr)
    if not found:
        return None
    return int(found.group(1)), found.group(2) == "unpacked in", Path(found.group(3))


def write_list(path, entries):
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(b"sqbox-warm-up 1\n" +
                     b"".join(kind.encode() + name.encode() + b"\0" for kind, name in entries))


def list_path(sqbox, image, env):
    """Where the caller's list of `image` goes, as --verbose says."""
    probe = sqbox.run(image, "true", options=["--verbose"], env=env)
    found = re.search(r"warm-up: (?:no list for this image yet \((\S+);|\d+ names from (\S+))",
                      probe.stderr)
    if found:
        return Path(found.group(1) or found.group(2))
    found = re.search(r"none learned yet \((\S+)\)", probe.stderr)
    assert found, probe.stderr
    return Path(found.group(1))


def test_the_python_images_own_list_unpacks_its_start_up_files_once(sqbox, python_image,
                                                                     tmp_path):
    """The default image carries the list of Python's start-up (/etc/sqbox/warm-up): a plain run
    with an empty cache unpacks those files, the next one finds them, and both run Python."""
    env = cache_env(tmp_path)
    first = sqbox.run(python_image, "python3", "-c", "print('one')", options=["--verbose"],
                      env=env)
    assert (first.returncode, first.stdout) == (0, "one\n"), first.stderr
    assert re.search(r"warm-up: \d+ names from the image's /etc/sqbox/warm-up", first.stderr)
    files, made, tree = unpacked(first.stderr)
    assert made and files > 0, first.stderr
    python = tree / "usr" / "bin" / "python3.11"
    assert python.is_file() and python.stat().st_size > 1 << 20
    assert stat.S_IMODE(python.stat().st_mode) == 0o755
    assert str(tree).startswith(str(tmp_path / "cache" / "warm-up")), tree

    second = sqbox.run(python_image, "python3", "-c", "print('two')", options=["--verbose"],
                       env=env)
    assert (second.returncode, second.stdout) == (0, "two\n"), second.stderr
    assert unpacked(second.stderr) == (files, False, tree), second.stderr
    # Only the tree, its stamp, and the lock beside it: no temporary or old tree left.
    assert sorted(os.listdir(tree.parent.parent)) == [".lock", tree.parent.name]
    assert sorted(os.listdir(tree.parent)) == ["image-list", "stamp", "tree"]
    # The image's list is kept with the entry: later runs read it there, not from the image.
    assert (tree.parent / "image-list").read_bytes().startswith(b"sqbox-warm-up 1\n")


def test_unpacked_files_look_exactly_as_in_the_image(sqbox, python_image, tmp_path):
    """Contents, sizes, permission bits, owners and modification times of the unpacked files and
    of the directories on their way are the image's. The one difference: a directory that now
    merges two layers reports a link count of 1 (overlayfs does not count a merged directory's
    subdirectories), so directories are compared without it."""
    env = cache_env(tmp_path)
    first = sqbox.run(python_image, "true", options=["--verbose"], env=env)
    files, _, tree = unpacked(first.stderr)
    assert files > 0, first.stderr
    # /etc's own attributes are those of the sandbox's generated /etc, made afresh each run.
    inside = sorted("/" + str(path.relative_to(tree)) for path in tree.rglob("*"))
    inside.remove("/etc")
    assert "/usr/bin/python3.11" in inside and "/usr/lib" in inside
    (tmp_path / "describe.py").write_text(DESCRIBE)
    options = ["--mount", f"{tmp_path}:/probe:ro"]
    runs = {}
    for mode in ([], ["--no-warm-up"]):
        result = sqbox.run(python_image, "python3", "/probe/describe.py", *inside,
                           options=options + mode, env=env)
        assert result.returncode == 0, result.stderr
        runs[bool(mode)] = result.stdout.splitlines()
    assert len(runs[False]) == len(inside)
    assert runs[False] == runs[True]


def test_an_unpacked_file_written_in_the_sandbox_stays_in_the_sandbox(sqbox, python_image,
                                                                      tmp_path):
    env = cache_env(tmp_path)
    first = sqbox.run(python_image, "true", options=["--verbose"], env=env)
    _, _, tree = unpacked(first.stderr)
    unpacked_c = tree / "usr" / "lib" / "x86_64-linux-gnu" / "libc.so.6"
    before = hashlib.sha256(unpacked_c.read_bytes()).hexdigest()
    result = sqbox.run(python_image, "sh", "-c",
                       "echo changed >> /usr/lib/x86_64-linux-gnu/libc.so.6 && "
                       "tail -c 8 /usr/lib/x86_64-linux-gnu/libc.so.6; "
                       "rm /usr/bin/python3.11 && test ! -e /usr/bin/python3.11 && echo gone; "
                       "grep -c /warm-up/ /proc/self/mountinfo",
                       env=env)
    assert result.stdout.splitlines() == ["changed", "gone", "0"], result.stderr
    assert hashlib.sha256(unpacked_c.read_bytes()).hexdigest() == before
    assert (tree / "usr" / "bin" / "python3.11").is_file()
    again = sqbox.run(python_image, "python3", "-c", "print('still here')", env=env)
    assert (again.returncode, again.stdout) == (0, "still here\n"), again.stderr


def test_a_rewritten_image_or_a_new_list_gets_a_new_tree(sqbox, busybox_image, tmp_path):
    image = tmp_path / "busybox.sqsh"
    shutil.copyfile(busybox_image, image)
    env = cache_env(tmp_path)
    path = list_path(sqbox, str(image), env)
    write_list(path, [("R", "/etc/fstab")])
    made = sqbox.run(str(image), "cat", "/etc/fstab", options=["--verbose"], env=env)
    assert made.returncode == 0, made.stderr
    files, was_made, tree = unpacked(made.stderr)
    assert (files, was_made) == (1, True), made.stderr
    assert (tree / "etc" / "fstab").read_text() == made.stdout

    os.utime(image)  # the image file rewritten in place: new times
    again = sqbox.run(str(image), "true", options=["--verbose"], env=env)
    assert unpacked(again.stderr) == (1, True, tree), again.stderr

    write_list(path, [("R", "/etc/fstab"), ("R", "/etc/environment"), ("L", "/etc/nothing")])
    listed = sqbox.run(str(image), "cat", "/etc/environment", options=["--verbose"], env=env)
    assert unpacked(listed.stderr) == (2, True, tree), listed.stderr
    assert (tree / "etc" / "environment").read_text() == listed.stdout
    assert sorted(os.listdir(tree.parent.parent)) == [".lock", path.name, tree.parent.name]


def test_learning_runs_and_no_warm_up_runs_unpack_nothing(sqbox, busybox_image, tmp_path):
    """A learning run reads everything through the image server, which records it; --no-warm-up
    leaves the list, and so its files, alone."""
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    write_list(path, [("R", "/etc/fstab")])
    for options in (["--learn-warm-up"], ["--no-warm-up"]):
        result = sqbox.run(busybox_image, "true", options=options + ["--verbose"], env=env)
        assert result.returncode == 0, result.stderr
        assert unpacked(result.stderr) is None, result.stderr
        # The entry the first run made (from the image, which has no list) is left as it was.
        assert b"\nlist image\n" in (path.parent / (path.name + ".files") / "stamp").read_bytes()
        assert not list(path.parent.glob("*.files/tree/*"))


def test_files_that_must_stay_in_the_image_are_not_unpacked(sqbox, busybox_image, tmp_path):
    """Hard links (their link count), setuid and setgid files (their mode bits), anything but a
    regular file: what the sandbox would see differently is served from the image."""
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    (rootfs / "data").mkdir()
    (rootfs / "data" / "plain").write_text("plain\n")
    (rootfs / "data" / "linked").write_text("linked\n")
    os.link(rootfs / "data" / "linked", rootfs / "data" / "other-name")
    (rootfs / "data" / "setuid").write_text("setuid\n")
    (rootfs / "data" / "setuid").chmod(0o4755)
    (rootfs / "data" / "setgid").write_text("setgid\n")
    (rootfs / "data" / "setgid").chmod(0o2755)
    os.mkfifo(rootfs / "data" / "fifo")
    os.symlink("plain", rootfs / "data" / "link-to-plain")
    image = tmp_path / "data.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    env = cache_env(tmp_path)
    path = list_path(sqbox, str(image), env)
    names = ["linked", "other-name", "setuid", "setgid", "fifo", "link-to-plain", "missing"]
    write_list(path, [("R", "/data/" + name) for name in names] + [("R", "/data")])
    result = sqbox.run(str(image), "cat", "/data/plain", "/data/linked", options=["--verbose"],
                       env=env)
    assert (result.returncode, result.stdout) == (0, "plain\nlinked\n"), result.stderr
    files, _, tree = unpacked(result.stderr)
    # Only what the symlink leads to, under its own name.
    assert files == 1
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == ["data", "data/plain"]


def test_a_tree_left_half_made_by_a_killed_run_is_cleared(sqbox, busybox_image, tmp_path):
    """A run killed while it unpacks leaves KEY.files.tmp (and one killed while it swaps trees,
    KEY.files.old); the next run that makes the tree removes them, whatever they hold."""
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    write_list(path, [("R", "/etc/fstab")])
    for leftover in (".files.tmp", ".files.old"):
        stale = path.parent / (path.name + leftover)
        (stale / "tree" / "etc").mkdir(parents=True)
        (stale / "tree" / "etc" / "fstab").write_text("stale\n")
        (stale / "tree" / "etc").chmod(0o555)
    result = sqbox.run(busybox_image, "cat", "/etc/fstab", options=["--verbose"], env=env)
    assert result.returncode == 0 and "stale" not in result.stdout, result.stderr
    files, made, tree = unpacked(result.stderr)
    assert (files, made) == (1, True), result.stderr
    assert (tree / "etc" / "fstab").read_text() == result.stdout
    assert sorted(os.listdir(path.parent)) == [".lock", path.name, path.name + ".files"]


def test_a_directory_the_image_closes_still_has_its_files_unpacked(sqbox, busybox_image,
                                                                   tmp_path):
    """A directory of mode 0000 or 0555 in the image: the files below it are unpacked (it is
    closed only once they are in), and it keeps the image's mode."""
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    (rootfs / "closed" / "deeper").mkdir(parents=True)
    (rootfs / "closed" / "deeper" / "file").write_text("below a closed directory\n")
    (rootfs / "closed" / "deeper").chmod(0o555)
    image = tmp_path / "closed.sqsh"
    # The mode given to mksquashfs, which could not read the directory unprivileged otherwise.
    subprocess.run(["mksquashfs", str(rootfs), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress", "-p", "closed m 0000 0 0"], check=True,
                   stdout=subprocess.DEVNULL)
    env = cache_env(tmp_path)
    path = list_path(sqbox, str(image), env)
    write_list(path, [("R", "/closed/deeper/file")])
    # The sandbox's user cannot look inside /closed, with or without the unpacked files.
    probe = "stat -c %a /closed; cat /closed/deeper/file || echo refused"
    result = sqbox.run(str(image), "sh", "-c", probe, options=["--verbose"], env=env)
    plain = sqbox.run(str(image), "sh", "-c", probe, options=["--no-warm-up"], env=env)
    assert result.returncode == plain.returncode == 0, result.stderr
    assert result.stdout == plain.stdout == "0\nrefused\n"
    files, made, tree = unpacked(result.stderr)
    assert (files, made) == (1, True), result.stderr
    assert stat.S_IMODE((tree / "closed").stat().st_mode) == 0
    (tree / "closed").chmod(0o700)  # the caller's own tree: to look inside, and to clean up
    assert (tree / "closed" / "deeper" / "file").read_text() == "below a closed directory\n"


def test_the_payload_gets_no_descriptor_of_the_unpacked_files(sqbox, busybox_image, tmp_path):
    """The launcher keeps a descriptor of the unpacked tree for the supervisor's check; init
    closes its copy first thing, and the payload has only its stdio (and the descriptor `ls`
    opens to list)."""
    env = cache_env(tmp_path)
    path = list_path(sqbox, busybox_image, env)
    write_list(path, [("R", "/bin/busybox"), ("R", "/etc/fstab")])
    result = sqbox.run(busybox_image, "ls", "-l", "/proc/self/fd/", options=["--verbose"],
                       env=env)
    assert result.returncode == 0, result.stderr
    assert unpacked(result.stderr) is not None, result.stderr
    assert "warm-up" not in result.stdout and "tree" not in result.stdout, result.stdout
    # "lr-x------ 1 user group 64 Nov 21 17:49 3[ -> target]": the ninth field.
    descriptors = sorted(int(line.split()[8]) for line in result.stdout.splitlines()
                         if line.startswith("l"))
    assert descriptors == [0, 1, 2, 3], result.stdout

"""sqbox as enroot: the command line, the container store, and enroot's image format.

Everything runs the real binary through a symlink named `enroot` on PATH, as a harness would.
"""
import fcntl
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from host_processes import PRINT_PID_NAMESPACE, processes_in_pid_namespace


class Enroot:
    def __init__(self, binary, tmp_path):
        self.bin_dir = tmp_path / "bin"
        self.bin_dir.mkdir()
        (self.bin_dir / "enroot").symlink_to(binary)
        self.data = tmp_path / "data"
        self.env = {
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "ENROOT_DATA_PATH": str(self.data),
            "LANG": "C",
        }

    def __call__(self, *args, input=None, env=None, timeout=120, cwd=None):
        full_env = dict(self.env, **(env or {}))
        return subprocess.run(["enroot", *args], input=input, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=full_env, timeout=timeout,
                              cwd=cwd)

    def store_entries(self):
        return sorted(os.listdir(self.data)) if self.data.exists() else []


@pytest.fixture
def enroot(sqbox_bin, tmp_path):
    runner = Enroot(sqbox_bin, tmp_path)
    yield runner
    # overlayfs leaves its work directories at mode 000: make the store removable for pytest.
    for directory, subdirs, _ in os.walk(runner.data):
        for name in subdirs:
            os.chmod(os.path.join(directory, name), 0o700)


REMOVE = object()


def build_image(tmp_path, base_image, files, name="image"):
    """A new .sqsh: the base image's tree changed by `files`: {path: text, None for a
    directory, REMOVE to delete}."""
    tree = tmp_path / f"{name}-tree"
    subprocess.run(["unsquashfs", "-q", "-no-xattrs", "-d", str(tree), base_image], check=True,
                   stdout=subprocess.DEVNULL)
    for path, content in files.items():
        target = tree / path.lstrip("/")
        if content is REMOVE:
            target.unlink()
            continue
        if content is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        target.write_text(content)
        if path.startswith("/bin/"):
            target.chmod(0o755)
    image = tmp_path / f"{name}.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(tree)
    return str(image)


# An image as enroot's Docker importer writes it: WORKDIR /app, ENTRYPOINT ["/bin/entry.sh"],
# CMD ["default-cmd"], a label, ENV, and a VOLUME turned into a bind of the rootfs onto itself.
DOCKER_RC = """# enroot-provenance: docker://registry.example/app:1.0
# org.opencontainers.image.title sqbox test image

mkdir -p "/app" 2> /dev/null
cd "/app" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/bin/entry.sh' "$@"
else
    exec '/bin/entry.sh' 'default-cmd'
fi
"""
ENTRYPOINT = """#!/bin/sh
echo "entry: pwd=$(pwd) args=$* rc_local=${FROM_RC_LOCAL-} app_env=${APP_ENV-} caller=${FROM_CALLER-}"
[ "$1" = default-cmd ] && exit 0
exec "$@"
"""


@pytest.fixture(scope="module")
def docker_image(tmp_path_factory, busybox_image):
    tmp = tmp_path_factory.mktemp("docker-image")
    return build_image(tmp, busybox_image, {
        "/etc/rc": DOCKER_RC,
        "/etc/rc.local": "# sourced by /etc/rc\nexport FROM_RC_LOCAL=yes\n",
        "/etc/environment": "APP_ENV=production\nFROM_CALLER=${SQBOX_TEST_VAR}\n"
                            "PATH=/usr/local/bin:/usr/bin:/bin\n",
        "/etc/fstab": "${ENROOT_ROOTFS}/data /vol none x-create=dir,bind,rw,nosuid,nodev\n"
                      "tmpfs /scratch tmpfs x-create=dir,size=1m 0 0\n",
        "/bin/entry.sh": ENTRYPOINT,
        "/app": None,
        "/data/volume-file": "in the volume\n",
    })


# ---- the command line ----

def test_usage_and_exit_statuses_follow_enroot(enroot):
    bare = enroot()
    assert bare.returncode == 1 and bare.stdout.startswith("Usage: enroot COMMAND")
    assert enroot("help").returncode == 0
    assert enroot("frobnicate").returncode == 1
    start_help = enroot("start", "--help")
    assert start_help.returncode == 0
    assert start_help.stdout.startswith("Usage: enroot start [options] [--] NAME|IMAGE")
    bad_option = enroot("start", "--bogus", "x")
    assert bad_option.returncode == 1 and "Usage: enroot start" in bad_option.stdout
    assert enroot("create").returncode == 1
    assert enroot("create", "--name").returncode == 1
    assert enroot("remove").returncode == 1
    version = enroot("version")
    assert version.returncode == 0 and version.stdout.strip()
    unsupported = enroot("bundle", "image.sqsh")
    assert unsupported.returncode == 1
    assert unsupported.stderr.startswith("[ERROR] ") and "not supported" in unsupported.stderr
    assert enroot("import").returncode == 1  # usage: import needs a URI


def test_sqbox_enroot_subcommand_is_the_same_front_end(sqbox_bin, enroot, busybox_image):
    result = subprocess.run([sqbox_bin, "enroot", "start", busybox_image, "echo", "via sqbox"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=enroot.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "via sqbox\n"


def test_create_list_start_remove(enroot, busybox_image):
    created = enroot("create", "--name", "box", busybox_image)
    assert created.returncode == 0, created.stderr
    assert enroot("list").stdout == "box\n"
    fancy = enroot("list", "--fancy")
    assert fancy.returncode == 0 and "box" in fancy.stdout and busybox_image in fancy.stdout
    started = enroot("start", "box", "sh", "-c", "echo $((6*7))")
    assert (started.returncode, started.stdout) == (0, "42\n"), started.stderr
    assert enroot("remove", "-f", "box").returncode == 0
    assert enroot("list").stdout == ""
    # Nothing but the store's lock file remains.
    assert enroot.store_entries() == [".sqbox-store.lock"]


def test_default_name_is_the_image_file_name(enroot, busybox_image):
    assert enroot("create", busybox_image).returncode == 0
    assert enroot("list").stdout == Path(busybox_image).name[:-len(".sqsh")] + "\n"


def test_store_errors_are_enroots(enroot, busybox_image, tmp_path):
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    again = enroot("create", "-n", "box", busybox_image)
    assert again.returncode == 1
    assert again.stderr == f"[ERROR] File already exists: {enroot.data}/box\n"
    not_squashfs = tmp_path / "not.sqsh"
    not_squashfs.write_text("hello")
    bad = enroot("create", "-n", "other", str(not_squashfs))
    assert bad.returncode == 1 and "[ERROR] Invalid image format" in bad.stderr
    missing = enroot("create", "-n", "other", str(tmp_path / "missing.sqsh"))
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr
    slash = enroot("create", "-n", "a/b", busybox_image)
    assert slash.returncode == 1 and "[ERROR] Invalid argument: a/b" in slash.stderr
    for command in (["start", "nothere"], ["remove", "-f", "nothere"], ["export", "nothere"]):
        result = enroot(*command)
        assert result.returncode == 1, command
        assert result.stderr == f"[ERROR] No such file or directory: {enroot.data}/nothere\n"
    assert enroot("start", "../box").returncode == 1
    assert enroot("list").stdout == "box\n"


def test_remove_without_force_asks(enroot, busybox_image):
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    declined = enroot("remove", "box", input="n\n")
    assert declined.returncode == 0 and "Do you really want to delete" in declined.stderr
    assert enroot("list").stdout == "box\n"
    assert enroot("remove", "box", input="y\n").returncode == 0
    assert enroot("list").stdout == ""


def test_create_force_replaces_the_layer(enroot, busybox_image):
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    assert enroot("start", "--rw", "box", "sh", "-c", "echo old > /state").returncode == 0
    assert enroot("create", "-f", "-n", "box", busybox_image).returncode == 0
    after = enroot("start", "box", "cat", "/state")
    assert after.returncode != 0 and "No such file" in after.stderr


def test_create_does_not_unpack(enroot, python_image):
    assert enroot("create", "-n", "py", python_image).returncode == 0
    container = enroot.data / "py"
    stored = sum(f.stat().st_size for f in container.rglob("*") if f.is_file())
    assert stored < 4096, f"a container should hold a reference, not a copy ({stored} bytes)"


# ---- start: the root filesystem ----

def test_root_is_read_only_unless_rw_and_rw_persists(enroot, busybox_image):
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    read_only = enroot("start", "box", "sh", "-c", "echo x > /file")
    assert read_only.returncode != 0 and "Read-only file system" in read_only.stderr
    assert enroot("start", "box", "sh", "-c", "echo x > /tmp/file").returncode == 0
    assert enroot("start", "--rw", "box", "sh", "-c", "echo kept > /etc/state").returncode == 0
    assert enroot("start", "box", "cat", "/etc/state").stdout == "kept\n"
    # ENROOT_ROOTFS_WRITABLE is --rw, with enroot's yes/no spellings.
    assert enroot("start", "box", "sh", "-c", "echo 2 > /etc/state",
                  env={"ENROOT_ROOTFS_WRITABLE": "yes"}).returncode == 0
    assert enroot("start", "box", "sh", "-c", "echo 3 > /etc/state",
                  env={"ENROOT_ROOTFS_WRITABLE": "no"}).returncode != 0
    assert enroot("start", "box", "cat", "/etc/state").stdout == "2\n"


def test_rw_keeps_removals_replaced_directories_links_and_sparse_files(enroot, busybox_image):
    """What a --rw start does to the image's files is saved when it ends: a removal, a directory
    replaced by a new one (nothing of the old shows), a symlink, a file that is mostly hole."""
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    changed = enroot("start", "--rw", "box", "sh", "-c",
                     "rm /bin/ed && rm -r /usr/sbin && mkdir /usr/sbin && echo new > /usr/sbin/only"
                     " && ln -s /bin/busybox /link && truncate -s 20G /sparse && echo end >> /sparse")
    assert changed.returncode == 0, changed.stderr
    after = enroot("start", "box", "sh", "-c",
                   "test -e /bin/ed; echo ed $?; ls /usr/sbin; readlink /link; "
                   "stat -c %s /sparse; tail -c 4 /sparse")
    assert after.stdout == "ed 1\nonly\n/bin/busybox\n21474836484\nend\n", after.stderr
    saved = next((enroot.data / "box" / "upper").glob("sparse"))
    assert saved.stat().st_blocks * 512 < 1 << 20, "the hole was written out"


def test_rw_start_adds_at_most_its_writable_budget(enroot, busybox_image):
    """A --rw start writes into the sandbox's bounded tmpfs, and only that is saved: a payload
    that writes without end fills its budget, not the host's disk."""
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    filled = enroot("start", "--rw", "box", "sh", "-c",
                    "dd if=/dev/zero of=/fill bs=1M count=64 2>&1; echo dd $?",
                    env={"SQBOX_TMPFS_SIZE": "16M"})
    assert "No space left on device" in filled.stdout and "dd 1" in filled.stdout, filled
    stored = sum(f.stat().st_blocks * 512 for f in (enroot.data / "box" / "upper").rglob("*")
                 if f.is_file() and not f.is_symlink())
    assert 8 << 20 < stored <= 16 << 20, stored


def test_rw_saving_keeps_hard_links_so_the_budget_bounds_the_disk(enroot, busybox_image):
    """Hard links cost a tmpfs no data: a payload that links one file many times must not make
    saving write it out once per name. The names are saved as links of one file."""
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    linked = enroot("start", "--rw", "box", "sh", "-c",
                    "mkdir /l /l/d && dd if=/dev/urandom of=/l/f bs=1M count=4 2>/dev/null && "
                    "for i in $(seq 64); do ln /l/f /l/$i && ln /l/f /l/d/$i || exit 1; done",
                    env={"SQBOX_TMPFS_SIZE": "16M"})
    assert linked.returncode == 0, linked.stderr
    files = [f for f in (enroot.data / "box" / "upper" / "l").rglob("*")
             if f.is_file() and not f.is_symlink()]
    assert len(files) == 129
    inodes = {f.stat().st_ino: f.stat().st_blocks * 512 for f in files}
    assert sum(inodes.values()) <= 16 << 20, (len(inodes), sum(inodes.values()))
    check = enroot("start", "box", "sh", "-c", "cmp /l/f /l/64 && cmp /l/f /l/d/1 && "
                   "stat -c %h /l/d/33")
    assert check.returncode == 0 and check.stdout == "129\n", check


def test_rw_saving_writes_no_more_data_than_the_budget_held(enroot, busybox_image):
    """Links whose first name is too deep to link to by path are copied: saving stops, with one
    line, before the host's disk gets more data than the sandbox's tmpfs held."""
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    linked = enroot("start", "--rw", "box", "sh", "-c",
                    "mkdir /t && cd /t && dd if=/dev/zero of=f bs=1M count=4 2>/dev/null && "
                    "for i in $(seq 32); do ln f $i || exit 1; done && cd / && for i in $(seq 17);"
                    f" do mkdir /n && mv /t /n/{'d' * 250} && mv /n /t || exit 1; done",
                    env={"SQBOX_TMPFS_SIZE": "16M"})
    assert linked.returncode == 1, linked
    assert linked.stderr.count("\n") == 1, linked.stderr
    assert "more data than the sandbox's tmpfs held" in linked.stderr, linked.stderr
    # du walks by descriptor (any depth) and counts a file's blocks once whatever its links.
    du = subprocess.run(["du", "-s", "--block-size=1", str(enroot.data / "box" / "upper")],
                        stdout=subprocess.PIPE, text=True, check=True)
    assert int(du.stdout.split()[0]) <= 17 << 20, du.stdout
    assert enroot("remove", "-f", "box").returncode == 0  # the fixture cannot walk that deep


def test_rw_saving_errors_quote_the_payloads_names_without_terminal_controls(enroot,
                                                                            busybox_image):
    """The payload names the files that saving fails on (here: past the data the tmpfs held).
    Names carrying a newline and terminal escapes (OSC 52 would set the caller's clipboard) reach
    the caller's stderr as one line with those blanked."""
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    evil = r"$(printf '\033]52;c;aGk=\007\nx')"
    linked = enroot("start", "--rw", "box", "sh", "-c",
                    "mkdir /t && cd /t && dd if=/dev/zero of=f bs=1M count=4 2>/dev/null && "
                    f"for i in $(seq 32); do ln f \"{evil}$i\" || exit 1; done && cd / && "
                    f"for i in $(seq 17); do mkdir /n && mv /t /n/{'d' * 250} && mv /n /t || exit 1;"
                    " done", env={"SQBOX_TMPFS_SIZE": "16M"})
    assert linked.returncode == 1, linked
    assert "more data than the sandbox's tmpfs held" in linked.stderr, linked.stderr
    assert linked.stderr.count("\n") == 1, linked.stderr
    # The name is there, its controls blanked.
    assert "]52;c;aGk=  x" in linked.stderr, repr(linked.stderr)
    assert "\033" not in linked.stderr and "\007" not in linked.stderr, repr(linked.stderr)
    assert enroot("remove", "-f", "box").returncode == 0  # the fixture cannot walk that deep


def test_rw_saving_a_deep_tree_takes_memory_by_its_depth_not_its_square(enroot, python_image):
    """12,000 directories one in another (the payload's tmpfs holds them: each is one inode; a
    1 GiB budget holds 65,536) are saved by a supervisor limited to 96 MiB of data: what it holds
    per level is the name, not the path from the root (12,000 paths averaging 12 KB: 144 MB)."""
    assert enroot("create", "-n", "box", python_image).returncode == 0
    deep = ("import os\nos.mkdir('/deep'); os.chdir('/deep')\n"
            "for _ in range(12000): os.mkdir('d'); os.chdir('d')\n"
            "open('end', 'w').write('bottom')\n")
    # The soft limit only: the image server sets its own.
    limited = ["prlimit", f"--data={96 << 20}:unlimited", "enroot"]
    made = subprocess.run([*limited, "start", "--rw", "box", "python3", "-c", deep],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=enroot.env, timeout=600)
    assert made.returncode == 0, made.stderr
    check = enroot("start", "box", "python3", "-c",
                   "import os\nos.chdir('/deep')\nfor _ in range(12000): os.chdir('d')\n"
                   "print(open('end').read())")
    assert check.returncode == 0 and check.stdout == "bottom\n", check
    assert enroot("remove", "-f", "box").returncode == 0  # the fixture cannot walk that deep


def test_rw_saving_never_follows_a_link_out_of_the_container(enroot, busybox_image, tmp_path):
    """A start leaves symlinks to a host directory where later starts put a directory and a
    file: saving replaces the links and writes nothing through them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    planted = enroot("start", "--rw", "box", "sh", "-c",
                     f"ln -s {outside} /d && ln -s {outside}/f /f && ln -s {outside} /bin/x")
    assert planted.returncode == 0, planted.stderr
    replaced = enroot("start", "--rw", "box", "sh", "-c",
                      "rm /d /f /bin/x && mkdir /d && echo in > /d/f && echo in > /f && "
                      "mkdir /bin/x && echo in > /bin/x/f")
    assert replaced.returncode == 0, replaced.stderr
    assert list(outside.iterdir()) == []
    check = enroot("start", "box", "cat", "/d/f", "/f", "/bin/x/f")
    assert check.stdout == "in\nin\nin\n", check.stderr


def test_starting_an_image_directly_is_ephemeral(enroot, busybox_image):
    writes = enroot("start", "--rw", busybox_image, "sh", "-c", "echo x > /file && cat /file")
    assert writes.returncode == 0 and writes.stdout == "x\n", writes.stderr
    assert enroot("start", busybox_image, "test", "-e", "/file").returncode == 1
    assert enroot.store_entries() in ([], [".sqbox-store.lock"])


def test_start_caps_output_and_writes_as_sqbox_run_does(enroot, busybox_image):
    """A harness that captures `enroot start` output gets at most 16 MiB of each stream; the
    container's /tmp, /dev/shm and root share one writable budget. SQBOX_OUTPUT_LIMIT and
    SQBOX_TMPFS_SIZE change them, since enroot's command line has no place for them."""
    twenty = "head -c 20971520 /dev/zero | tr '\\0' o"
    capped = enroot("start", busybox_image, "sh", "-c", twenty)
    assert capped.returncode == 0
    assert capped.stdout == "o" * (16 << 20)
    assert capped.stderr == ("sqbox: output truncated: stdout passed --output-limit "
                             "(16777216 bytes); the rest was discarded\n")
    lifted = enroot("start", busybox_image, "sh", "-c", twenty,
                    env={"SQBOX_OUTPUT_LIMIT": "unlimited"})
    assert len(lifted.stdout) == 20 << 20 and lifted.stderr == ""
    small = enroot("start", busybox_image, "sh", "-c", "echo 1234567890",
                   env={"SQBOX_OUTPUT_LIMIT": "4"})
    assert small.stdout == "1234"
    fill = ("dd if=/dev/zero of=/tmp/a bs=1M count=12 2>/dev/null; "
            "dd if=/dev/zero of=/dev/shm/b bs=1M count=12 2>&1 | grep -o 'No space left'")
    shared = enroot("start", busybox_image, "sh", "-c", fill, env={"SQBOX_TMPFS_SIZE": "16M"})
    assert shared.stdout == "No space left\n", shared
    bad = enroot("start", busybox_image, "true", env={"SQBOX_OUTPUT_LIMIT": "lots"})
    assert bad.returncode == 1
    assert bad.stderr == ("[ERROR] invalid value 'lots' for SQBOX_OUTPUT_LIMIT: expected a size "
                          "such as 4096, 64k, 512M or 1G\n")


def test_bad_image_server_idle_times_are_refused_as_enroot_refuses(enroot, busybox_image):
    """SQBOX_IMAGE_SERVER_IDLE under the enroot front end: enroot's exit status (1) and "[ERROR]"
    line, the range in the message (0 is valid), and no container, store or cache written."""
    for bad in ("-1", "lots", "1.5", "86401"):
        result = enroot("start", busybox_image, "true", env={"SQBOX_IMAGE_SERVER_IDLE": bad})
        assert result.returncode == 1, result
        assert result.stderr == (f"[ERROR] invalid value '{bad}' for SQBOX_IMAGE_SERVER_IDLE: "
                                 "expected a whole number of seconds from 0 (the sandbox serves "
                                 "its image itself) to 86400 (a day)\n")
        assert result.stdout == ""
    assert enroot.store_entries() == []
    assert not (enroot.data.parent / ".cache").exists()
    served_alone = enroot("start", busybox_image, "true", env={"SQBOX_IMAGE_SERVER_IDLE": "0"})
    assert served_alone.returncode == 0, served_alone.stderr


def test_root_option_and_env_option(enroot, busybox_image):
    as_root = enroot("start", "--root", busybox_image, "id", "-u")
    assert as_root.stdout == "0\n"
    as_self = enroot("start", busybox_image, "id", "-u")
    assert as_self.stdout == f"{os.geteuid()}\n"
    remapped = enroot("start", busybox_image, "id", "-u", env={"ENROOT_REMAP_ROOT": "y"})
    assert remapped.stdout == "0\n"
    env = enroot("start", "-e", "GIVEN=value", "-e", "COPIED", "--env=EQ=1", busybox_image,
                 "sh", "-c", 'echo "$GIVEN $COPIED $EQ ${SECRET-unset}"',
                 env={"COPIED": "from-caller", "SECRET": "api-key"})
    assert env.stdout == "value from-caller 1 unset\n", env.stderr
    bad = enroot("start", "-e", "1BAD=x", busybox_image, "true")
    assert bad.returncode == 1 and "[ERROR] Invalid argument: 1BAD=x" in bad.stderr


def test_mount_option_uses_colon_separated_fstab_fields(enroot, busybox_image, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "in").write_text("from host\n")
    rw = enroot("start", "--mount", f"{shared}:/work", busybox_image,
                "sh", "-c", "cat /work/in; echo back > /work/out")
    assert rw.returncode == 0 and rw.stdout == "from host\n", rw.stderr
    assert (shared / "out").read_text() == "back\n"
    ro = enroot("start", "-m", f"{shared}:/work:none:x-create=dir,bind,ro", busybox_image,
                "sh", "-c", "echo x > /work/denied")
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr
    relative = enroot("start", "-m", ".:/mnt", busybox_image, "cat", "/mnt/in", cwd=shared)
    assert relative.stdout == "from host\n", relative.stderr
    bad = enroot("start", "-m", "a b:/x", busybox_image, "true")
    assert bad.returncode == 1 and "[ERROR] Invalid argument" in bad.stderr


# ---- start: /etc/rc, /etc/environment, /etc/fstab ----

def test_docker_imported_image_runs_as_under_enroot(enroot, docker_image):
    assert enroot("create", "-n", "app", docker_image).returncode == 0
    default = enroot("start", "app", env={"SQBOX_TEST_VAR": "substituted"})
    assert default.returncode == 0, default.stderr
    assert default.stdout == ("entry: pwd=/app args=default-cmd rc_local=yes app_env=production "
                              "caller=substituted\n")
    command = enroot("start", "app", "sh", "-c", "echo ran; exit 4")
    assert command.returncode == 4
    assert command.stdout.splitlines() == [
        "entry: pwd=/app args=sh -c echo ran; exit 4 rc_local=yes app_env=production caller=",
        "ran"]


def test_image_fstab_extensions_are_applied(enroot, docker_image):
    result = enroot("start", docker_image, "sh", "-c",
                    "cat /vol/volume-file; grep -E ' /(vol|scratch) ' /proc/mounts | cut -d' ' -f2,3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "in the volume"
    assert sorted(lines[2:]) == ["/scratch tmpfs", "/vol overlay"]


def test_image_fstab_may_not_mount_host_paths(enroot, busybox_image, tmp_path):
    image = build_image(tmp_path, busybox_image,
                        {"/etc/fstab": "# wants the host's /etc\n/etc /hostetc none x-create=dir,bind\n"})
    refused = enroot("start", image, "true")
    assert refused.returncode == 1
    assert "the image's /etc/fstab line 2: refusing to mount host path /etc" in refused.stderr
    optional = build_image(tmp_path, busybox_image,
                           {"/etc/fstab": "/etc /hostetc none x-create=dir,bind,nofail\n"},
                           name="optional")
    skipped = enroot("start", optional, "sh", "-c", "test -e /hostetc/passwd || echo absent")
    assert skipped.returncode == 0 and "warning" in skipped.stderr
    assert skipped.stdout == "absent\n"


def test_malformed_environment_line_is_reported(enroot, busybox_image, tmp_path):
    image = build_image(tmp_path, busybox_image,
                        {"/etc/environment": "GOOD=1\n\nnot an assignment\n"})
    result = enroot("start", image, "true")
    assert result.returncode == 1
    assert "/etc/environment line 3: expected KEY=VALUE" in result.stderr


def test_without_rc_the_command_runs_directly_or_a_shell_starts(enroot, busybox_image, tmp_path):
    plain = build_image(tmp_path, busybox_image, {"/etc/rc": REMOVE}, name="no-rc")
    direct = enroot("start", plain, "echo", "direct")
    assert direct.stdout == "direct\n", direct.stderr
    spaced = enroot("start", plain, "echo one && echo two")
    assert spaced.stdout == "one\ntwo\n"
    missing = enroot("start", plain, "no-such-command")
    assert missing.returncode == 127
    interactive = enroot("start", plain, input="echo interactive; exit 5\n")
    assert interactive.returncode == 5 and "interactive" in interactive.stdout
    # An empty rc is still the command script (enroot only tests that it exists).
    empty_rc = build_image(tmp_path, busybox_image, {"/etc/rc": ""}, name="empty-rc")
    never = enroot("start", empty_rc, "echo", "never")
    assert never.returncode == 0 and never.stdout == ""


def test_rc_option_overrides_the_command_script(enroot, busybox_image, tmp_path):
    rc = tmp_path / "my-rc"
    rc.write_text('echo "custom rc: $*"\nexec "$@"\n')
    result = enroot("start", "--rc", str(rc), busybox_image, "echo", "after")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "custom rc: echo after\nafter\n"
    missing = enroot("start", "--rc", str(tmp_path / "nope"), busybox_image, "true")
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr


def test_conf_script_functions_are_evaluated_in_a_sandbox(enroot, python_image, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "file").write_text("shared\n")
    marker = tmp_path / "ran-on-host"
    conf = tmp_path / "my.conf"
    conf.write_text(f"""#ENROOT_REMAP_ROOT=y
environ() {{
    echo "GREETING=hello $WHO"
    echo "QUOTED='a b'"
    touch {marker} 2>/dev/null
}}
mounts() {{
    echo "{shared} /mnt/shared none x-create=dir,bind,ro"
}}
rc() {{
    echo "conf rc: $@"
    exec "$@"
}}
""")
    result = enroot("start", "-c", str(conf), python_image, "sh", "-c",
                    'id -u; echo "$GREETING|$QUOTED"; cat /mnt/shared/file', env={"WHO": "world"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "conf rc: sh -c id -u; echo \"$GREETING|$QUOTED\"; cat /mnt/shared/file",
        "0", "hello world|a b", "shared"]
    assert not marker.exists(), "the configuration's functions must not run on the host"


def test_conf_hooks_are_refused(enroot, busybox_image, tmp_path):
    conf = tmp_path / "hooks.conf"
    conf.write_text("hooks() {\n    date > ${ENROOT_ROOTFS}/started\n}\n")
    result = enroot("start", "--conf", str(conf), busybox_image, "true")
    assert result.returncode == 1
    assert result.stderr.startswith("[ERROR] ") and "hooks()" in result.stderr


# ---- export ----

def test_export_writes_the_container_as_an_image(enroot, busybox_image, sqbox, tmp_path):
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    assert enroot("start", "--rw", "box", "sh", "-c",
                  "echo exported > /etc/marker && rm /bin/vi").returncode == 0
    output = tmp_path / "box.sqsh"
    exported = enroot("export", "-o", str(output), "box")
    assert exported.returncode == 0, exported.stderr
    check = sqbox.run(str(output), "sh", "-c", "cat /etc/marker; test -e /bin/vi || echo gone")
    assert check.stdout == "exported\ngone\n", check.stderr
    again = enroot("export", "-o", str(output), "box")
    assert again.returncode == 1 and "[ERROR] File already exists" in again.stderr
    assert enroot("export", "-f", "-o", str(output), "box").returncode == 0
    default = enroot("export", "box", cwd=tmp_path / "bin")
    assert default.returncode == 0 and (tmp_path / "bin" / "box.sqsh").is_file()


@pytest.mark.parametrize("root", [False, True], ids=["user", "root"])
def test_export_makes_no_file_setuid_that_the_image_did_not(enroot, busybox_image, tmp_path,
                                                             root):
    """A payload in a --rw container makes setuid and setgid programs (new ones, an image file
    it marks setuid through a symlink, an image setuid file it rewrites). In the exported image
    only the files the image itself had setuid or setgid, unchanged, keep those bits."""
    tree = tmp_path / "tree"
    subprocess.run(["unsquashfs", "-q", "-no-xattrs", "-d", str(tree), busybox_image],
                   check=True, stdout=subprocess.DEVNULL)
    for name, mode in (("su-image", 0o4755), ("wall-image", 0o2755), ("rewritten", 0o4755)):
        shutil.copy(tree / "bin" / "busybox", tree / "bin" / name)
        os.chmod(tree / "bin" / name, mode)
    image = tmp_path / "setid.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    assert enroot("create", "-n", "box", str(image)).returncode == 0
    attack = ("cp /bin/busybox /bin/mine && chmod 6755 /bin/mine && "
              "cp /bin/busybox /tmp/../etc/hidden && chmod 4755 /etc/hidden && "
              "chmod 4755 /bin/sh && chmod 2755 /bin/cat && "
              "printf XYZ | dd of=/bin/rewritten bs=1 seek=4096 conv=notrunc 2>/dev/null && "
              "chmod 4755 /bin/rewritten && "
              "ls -ln /bin/mine /etc/hidden /bin/busybox /bin/rewritten")
    made = enroot("start", "--rw", *(["--root"] if root else []), "box", "sh", "-c", attack)
    assert made.returncode == 0, made.stderr
    # The payload did make them setuid or setgid (busybox through the /bin/sh and /bin/cat links),
    # inside; saved into the container's layer on the host's disk, none of them keeps those bits.
    assert sum("s" in line[:10] for line in made.stdout.splitlines()) == 4, made.stdout
    assert "4 file(s) written without their setuid/setgid bits" in made.stderr, made.stderr
    layer = subprocess.run(["find", str(enroot.data / "box" / "upper"), "-perm", "/6000", "-type", "f"],
                           check=True, stdout=subprocess.PIPE, text=True).stdout
    assert layer == "", layer

    output = tmp_path / "out.sqsh"
    exported = enroot("export", "-o", str(output), "box")
    assert exported.returncode == 0, exported.stderr
    listing = subprocess.run(["unsquashfs", "-lln", str(output)], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    set_id = sorted(line.split("squashfs-root", 1)[1] for line in listing.splitlines()
                    if line.startswith("-") and ("s" in line[1:10].lower()))
    assert set_id == ["/bin/su-image", "/bin/wall-image"], listing


# ---- the harness loop, and concurrency ----

def test_torchforge_style_harness_loop(enroot, python_image, tmp_path):
    """Exactly what a harness does per step, 50 times: reset, create, run a script."""
    work = tmp_path / "work"
    work.mkdir()
    for step in range(50):
        (work / "script.py").write_text(
            "import sys\n"
            f"print('stdout of step {step}')\n"
            f"print('stderr of step {step}', file=sys.stderr)\n"
            f"sys.exit({step % 7})\n")
        enroot("remove", "-f", "sandbox")
        created = enroot("create", "--name", "sandbox", python_image)
        assert created.returncode == 0, created.stderr
        result = enroot("start", "--mount", f"{work}:/work", "sandbox",
                        "python3", "/work/script.py")
        assert result.stdout == f"stdout of step {step}\n"
        assert result.stderr == f"stderr of step {step}\n"
        assert result.returncode == step % 7
    assert enroot("list").stdout == "sandbox\n"


def test_concurrent_create_start_remove_keep_the_store_consistent(enroot, busybox_image):
    errors = []

    def worker(index):
        try:
            steps_of(index)
        except Exception as error:  # a hung command (TimeoutExpired) fails the test too
            errors.append(("worker", index, repr(error)))

    def steps_of(index):
        own = f"own-{index}"
        for step in range(12):
            steps = [
                (["create", "-f", "-n", "shared", busybox_image], {0}),
                (["start", "shared", "true"], {0, 1}),  # 1: the other worker removed it
                (["remove", "-f", "shared"], {0, 1}),
                (["create", "-n", own, busybox_image], {0}),
                (["start", "--rw", own, "sh", "-c", f"echo {step} > /step"], {0}),
                (["start", own, "cat", "/step"], {0}),
                (["remove", "-f", own], {0}),
            ]
            for args, allowed in steps:
                result = enroot(*args)
                if result.returncode not in allowed:
                    errors.append((args, result.returncode, result.stderr))
                elif result.returncode == 1 and "No such file or directory" not in result.stderr:
                    errors.append((args, result.returncode, result.stderr))
                elif args[:2] == ["start", own] and result.stdout != f"{step}\n":
                    errors.append((args, result.stdout))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # No half-made containers, no trash left behind.
    leftovers = [name for name in enroot.store_entries() if name != ".sqbox-store.lock"]
    assert leftovers in ([], ["shared"])


def test_a_start_runs_its_own_container_whole_while_the_name_is_removed_and_reused(
        enroot, busybox_image, tmp_path):
    # The CI failure this guards against: a start looked its container up by name, a concurrent
    # `remove -f` deleted the layer under the running sandbox, and /bin/sh vanished from its root.
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    assert enroot("start", "--rw", "box", "sh", "-c", "echo old > /state").returncode == 0
    sync = tmp_path / "sync"
    sync.mkdir()
    script = ("touch /sync/started; while [ ! -e /sync/go ]; do sleep 0.05; done; "
              "cat /state; ls /bin/sh")
    running = subprocess.Popen(["enroot", "start", "-m", f"{sync}:/sync", "box", "sh", "-c", script],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=enroot.env)
    try:
        deadline = time.monotonic() + 60
        while not (sync / "started").exists():
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline, "the held start never began"
            time.sleep(0.05)
        # Meanwhile the name is removed, reused and written: none of it reaches the running start.
        assert enroot("remove", "-f", "box").returncode == 0
        assert enroot("list").stdout == ""
        assert enroot("create", "-n", "box", busybox_image).returncode == 0
        rewritten = enroot("start", "--rw", "box", "sh", "-c", "echo new > /state")
        assert rewritten.returncode == 0, rewritten.stderr
        (sync / "go").touch()
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert (running.returncode, out) == (0, "old\n/bin/sh\n"), err
    assert enroot("start", "box", "cat", "/state").stdout == "new\n"
    # The removed container went with its last start: the store holds the new one only.
    entries = [name for name in enroot.store_entries() if name != ".sqbox-store.lock"]
    assert len(entries) == 2 and entries[0].startswith(".sqbox-container-"), entries
    assert entries[1] == "box" and os.readlink(enroot.data / "box") == entries[0]


def test_the_held_containers_descriptors_stay_outside_the_sandbox(enroot, busybox_image):
    # The front end holds the container's directory (and its lock file) open for the whole start:
    # a descriptor on the host's store inside the sandbox would be a way out (openat from it).
    # Every process of the sandbox is looked at from the host, while the payload waits.
    assert enroot("create", "-n", "box", busybox_image).returncode == 0
    start = subprocess.Popen(["enroot", "start", "box", "sh", "-c",
                              PRINT_PID_NAMESPACE + "echo ready; read line"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=enroot.env)
    try:
        namespace = start.stdout.readline().strip()
        assert start.stdout.readline() == "ready\n"
        links, unreadable = {}, []
        for pid in processes_in_pid_namespace(namespace):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                links[pid] = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
            except PermissionError:
                unreadable.append(pid)  # init, to an ordinary user (not dumpable)
            except FileNotFoundError:
                pass
        # At least the payload's shell (and, to root, init too) was looked at.
        assert links, (namespace, unreadable)
        if os.geteuid() == 0:
            assert unreadable == [] and len(links) >= 2, (links, unreadable)
        seen = "\n".join(link for fd_links in links.values() for link in fd_links)
        for leaked in (".sqbox-container-", "container.json", str(enroot.data)):
            assert leaked not in seen, links
    finally:
        start.communicate(input="done\n", timeout=60)
    assert start.returncode == 0


def test_leftover_trash_is_swept_but_not_while_another_remove_deletes_it(enroot, busybox_image):
    # A remove deletes its container's tree outside the store lock, holding a flock on it; a
    # concurrent remove sweeping leftovers must leave that tree alone (deleting it at the same
    # time made one of them fail on the other's half-deleted entries), then sweep it once free.
    assert enroot("create", "-n", "first", busybox_image).returncode == 0
    assert enroot("create", "-n", "second", busybox_image).returncode == 0
    trash = enroot.data / ".sqbox-trash-0000beef"
    (trash / "upper" / "deep").mkdir(parents=True)
    (trash / "upper" / "deep" / "file").write_text("x")
    held = os.open(trash, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = enroot("remove", "-f", "first")
        assert result.returncode == 0, result.stderr
        assert (trash / "upper" / "deep" / "file").exists()
        fcntl.flock(held, fcntl.LOCK_UN)
        result = enroot("remove", "-f", "second")
        assert result.returncode == 0, result.stderr
        assert not trash.exists()
    finally:
        os.close(held)
    assert enroot.store_entries() == [".sqbox-store.lock"]


def test_user_configuration_directory_is_applied(enroot, busybox_image, tmp_path):
    config = tmp_path / "config"
    (config / "environ.d").mkdir(parents=True)
    (config / "mounts.d").mkdir()
    (config / "environ.d" / "10-site.env").write_text(
        "# site settings\nSITE=${SITE_NAME}\nQUOTED=\"x y\"\nENROOT_SECRET=no\n")
    shared = tmp_path / "dataset"
    shared.mkdir()
    (shared / "rows").write_text("1\n2\n")
    (config / "mounts.d" / "10-data.fstab").write_text(f"{shared} /data none x-create=dir,bind,ro\n")
    (config / "mounts.d" / "ignored.txt").write_text("/etc /etc-host none bind\n")
    result = enroot("start", busybox_image, "sh", "-c",
                    'echo "$SITE|$QUOTED|${ENROOT_SECRET-unset}"; cat /data/rows; ls /etc-host',
                    env={"ENROOT_CONFIG_PATH": str(config), "SITE_NAME": "lab"})
    assert result.stdout.splitlines() == ["lab|x y|unset", "1", "2"], result.stderr
    assert result.returncode != 0  # /etc-host came from a file without the .fstab suffix


def test_image_fstab_detaches_its_own_mounts(enroot, busybox_image, tmp_path):
    image = build_image(tmp_path, busybox_image, {
        "/etc/fstab": "tmpfs /scratch tmpfs x-create=dir 0 0\nnone /scratch none x-detach 0 1\n"})
    result = enroot("start", image, "sh", "-c", "grep -c ' /scratch ' /proc/mounts")
    assert result.stdout == "0\n", result.stderr


def test_remove_handles_a_very_deep_layer(enroot, python_image):
    assert enroot("create", "-n", "deep", python_image).returncode == 0
    planted = enroot("start", "--rw", "deep", "python3", "-c",
                     "import os\nos.chdir('/')\nfor _ in range(5000):\n"
                     "    os.mkdir('d'); os.chdir('d'); open('f', 'w').close()\n"
                     "os.chmod('.', 0)\n")
    assert planted.returncode == 0, planted.stderr
    removed = enroot("remove", "-f", "deep")
    assert removed.returncode == 0, removed.stderr
    assert enroot.store_entries() == [".sqbox-store.lock"]

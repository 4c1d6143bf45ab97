"""sqbox run inside pod-like containers (conftest.py builds them): the matrix of docs/pods.md.

Each cell asserts what the docs promise there: full isolation, a named fallback (in --json and
once under --verbose), or a refusal with one stderr line that names the fix and exit status 125.
The escape tests run in the cells that run.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import POD_BIN, POD_IMAGES, make_squashfs, test_inputs

BUSYBOX = f"{POD_IMAGES}/busybox.sqsh"
DOCTOR = "(sqbox doctor explains)"


def one_line(stderr):
    # A warning the caller asked for (--seccomp none) may come first.
    lines = [line for line in stderr.splitlines() if line and "sqbox: warning:" not in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sqbox: "), stderr
    return lines[0]


def cache_entries(pod):
    images = Path(pod.cache) / "images"
    return sorted(p.name for p in images.iterdir()) if images.is_dir() else []


# ---- cells that refuse ----

@pytest.mark.parametrize("cell", [
    dict(),                                   # the default pod
    dict(fuse=True),                          # + /dev/fuse
    dict(proc="unmasked"),                    # + procMount: Unmasked
    dict(fuse=True, proc="unmasked"),
], ids=["default", "fuse", "unmasked-proc", "fuse+unmasked-proc"])
def test_under_the_default_seccomp_profile_sqbox_refuses_naming_the_profile(make_pod, cell):
    pod = make_pod(**cell)
    result, record = pod.sqbox_run(BUSYBOX, "echo", "ran")
    assert result.returncode == 125, result
    assert "ran" not in result.stdout
    line = one_line(result.stderr)
    assert "sqbox runs under a seccomp filter" in line
    assert "seccompProfile.type: Unconfined" in line and line.endswith(DOCTOR)
    assert record["exit_code"] == 125 and record["started"] is False
    assert record["error"] == line[len("sqbox: "):]
    # Refused before unpacking anything.
    assert cache_entries(pod) == []


@pytest.mark.parametrize("fuse", [False, True], ids=["no-fuse", "fuse"])
def test_with_masked_proc_sqbox_refuses_naming_proc_outer_and_the_pod_fix(make_pod, fuse):
    pod = make_pod(fuse=fuse, seccomp="unconfined")
    result, record = pod.sqbox_run(BUSYBOX, "echo", "ran")
    assert result.returncode == 125, result
    assert "ran" not in result.stdout
    line = one_line(result.stderr)
    assert "cannot mount a fresh /proc" in line
    assert "--proc outer" in line and "procMount: Unmasked" in line and line.endswith(DOCTOR)
    assert record["started"] is False and record["exit_code"] == 125


def test_with_user_namespaces_disabled_sqbox_names_the_sysctl(make_pod):
    pod = make_pod(seccomp="unconfined", proc="unmasked", fuse=True, user_namespaces=False)
    result, record = pod.sqbox_run(BUSYBOX, "echo", "ran")
    assert result.returncode == 125, result
    line = one_line(result.stderr)
    assert "user.max_user_namespaces is 0" in line and "sysctl -w" in line, line
    assert line.endswith(DOCTOR) and record["started"] is False
    # Control: nothing in the pod gets one.
    assert pod.run("unshare", "--user", "true").returncode != 0


def test_the_seccomp_refusal_is_what_the_kernel_says_without_sqbox(make_pod):
    """Control: the pod's own profile refuses a user namespace to anything in it."""
    result = make_pod().run("unshare", "--user", "true")
    assert result.returncode != 0
    assert "Operation not permitted" in result.stderr


# ---- cells that run ----

def test_without_fuse_an_image_runs_from_an_unpacked_copy(make_pod):
    pod = make_pod(seccomp="unconfined", proc="unmasked")
    result, record = pod.sqbox_run(BUSYBOX, "sh", "-c", "echo hello; id -u",
                                   options=["--verbose"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hello", "1000"]
    assert record["image_access"] == "unpacked" and record["proc"] == "fresh"
    said = [line for line in result.stderr.splitlines() if "unpacked copy" in line]
    assert len(said) == 1 and "made now" in said[0] and "No such file" in said[0], result.stderr
    entries = cache_entries(pod)
    assert len(entries) == 1 and ".tmp." not in entries[0]
    # The second run uses it, and says so.
    result, record = pod.sqbox_run(BUSYBOX, "echo", "again", options=["--verbose"])
    assert result.returncode == 0 and result.stdout == "again\n"
    assert "made before" in result.stderr
    assert cache_entries(pod) == entries
    # Without --verbose nothing is said.
    result, _ = pod.sqbox_run(BUSYBOX, "true")
    assert result.returncode == 0 and result.stderr == ""


def test_serve_without_fuse_serves_the_unpacked_copy(make_pod):
    """`sqbox serve` (one server per node in a pod) falls back as `run` does: its sandboxes run
    from the copy unpacked into the cache, which the server holds while it lives."""
    pod = make_pod(seccomp="unconfined", proc="unmasked")
    requests = "".join(json.dumps(r) + "\n" for r in (
        {"id": 1, "op": "run", "command": ["sh", "-c", "echo hello; id -u"]},
        {"id": 2, "op": "run", "command": ["sh", "-c", "echo x > /tmp/f; cat /tmp/f"]}))
    # Its stdin closed, the server answers what is under way and exits.
    served = subprocess.run(pod._argv([POD_BIN, "serve", BUSYBOX]), input=requests,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert served.returncode == 0, served.stderr
    answers = {a["id"]: a for a in map(json.loads, served.stdout.splitlines()) if "id" in a}
    assert 1 in answers, (served.stdout, served.stderr)
    assert answers[1]["exit_code"] == 0 and answers[1]["stdout"] == "hello\n1000\n", answers
    assert answers[2]["exit_code"] == 0 and answers[2]["stdout"] == "x\n", answers
    entries = cache_entries(pod)
    assert len(entries) == 1 and ".tmp." not in entries[0]


def test_with_fuse_and_unmasked_proc_the_sandbox_is_as_on_a_host(make_pod):
    pod = make_pod(seccomp="unconfined", proc="unmasked", fuse=True)
    result, record = pod.sqbox_run(BUSYBOX, "sh", "-c", "ls /proc | grep -c '^[0-9]'")
    assert result.returncode == 0, result.stderr
    # A pod's sandboxes share an image server too (docs/run.md, "The shared image server").
    assert record["image_access"] == "shared" and record["proc"] == "fresh"
    assert int(result.stdout) <= 4  # init, sh, ls, grep
    assert cache_entries(pod) == []


@pytest.mark.parametrize("fuse", [False, True], ids=["no-fuse", "fuse"])
def test_proc_outer_runs_and_is_recorded(make_pod, fuse):
    pod = make_pod(seccomp="unconfined", fuse=fuse)
    result, record = pod.sqbox_run(BUSYBOX, "sh", "-c", "cat /proc/self/status | head -1",
                                   options=["--proc", "outer", "--verbose"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Name:\tcat\n"
    assert record["proc"] == "outer"
    assert record["image_access"] == ("shared" if fuse else "unpacked")
    assert sum("--proc outer" in line for line in result.stderr.splitlines()) == 1


def test_proc_outer_needs_sqboxs_own_profile(make_pod):
    pod = make_pod(seccomp="unconfined")
    result, _ = pod.sqbox_run(BUSYBOX, "true", options=["--proc", "outer", "--seccomp", "none"])
    assert result.returncode == 125
    assert "--proc outer needs --seccomp default or strict" in one_line(result.stderr)


def test_a_bad_proc_value_is_one_line(sqbox_bin, busybox_image):
    result = subprocess.run([sqbox_bin, "run", "--proc", "host", busybox_image, "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 125
    assert "--proc: 'host' is neither fresh nor outer" in one_line(result.stderr)


def test_on_the_host_the_record_says_shared_and_fresh(sqbox_bin, busybox_image, tmp_path):
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        pytest.skip("/dev/fuse is not usable here")
    record = tmp_path / "r.json"
    result = subprocess.run([sqbox_bin, "run", "--json", str(record), busybox_image, "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 0, result.stderr
    parsed = json.loads(record.read_text())
    assert parsed["image_access"] == "shared" and parsed["proc"] == "fresh"


# ---- escapes, in the cells that run ----

# Looks at every process the payload can see, for the neighbour's secret and handles on it.
ESCAPE_PAYLOAD = r"""
secret=NEIGHBOUR_SECRET_7f3a
own=$$
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  cmd=$(tr '\0' ' ' < $dir/cmdline 2>/dev/null)
  [ "$cmd" = "sleep 4242 " ] && echo "sees-neighbour $pid"
  if grep -q $secret $dir/environ 2>/dev/null; then echo "LEAK environ $pid"; fi
  if dd if=$dir/mem bs=1 count=1 skip=4096 2>/dev/null | grep -q .; then echo "LEAK mem $pid"; fi
  if ls $dir/root/ >/dev/null 2>&1 && [ "$(ls $dir/root/work 2>/dev/null)" ]; then
    echo "LEAK root $pid"; fi
  if [ "$cmd" = "sleep 4242 " ]; then
    for fd in $dir/fd/*; do readlink $fd 2>/dev/null && echo "LEAK fd $pid"; done
    for f in cwd exe root; do readlink $dir/$f 2>/dev/null && echo "LEAK $f $pid"; done
  fi
done
cat /work/pod-secret 2>/dev/null && echo "LEAK file"
ls /cache 2>/dev/null | grep -q . && echo "LEAK cache"
kill -9 -1 2>/dev/null
echo done
"""


def run_with_neighbour(pod, options):
    """In the pod: a neighbour process holding a secret in its environment, then the payload;
    afterwards, whether the neighbour still lives."""
    Path(pod.work, "pod-secret").write_text("POD_FILE_SECRET\n")
    script = (
        "NEIGHBOUR=NEIGHBOUR_SECRET_7f3a sleep 4242 & n=$!; "
        f"/sqbox/bin/sqbox run {' '.join(options)} {BUSYBOX} -- sh -c \"$1\"; "
        "echo status=$?; kill -0 $n && echo neighbour-alive")
    return pod.run("sh", "-c", script, "sh", ESCAPE_PAYLOAD)


@pytest.mark.parametrize("cell", [
    dict(seccomp="unconfined", proc="unmasked"),
    dict(seccomp="unconfined", proc="unmasked", fuse=True),
], ids=["unpacked", "fuse"])
def test_with_a_fresh_proc_the_payload_sees_nothing_of_the_pod(make_pod, cell):
    result = run_with_neighbour(make_pod(**cell), [])
    assert "status=0" in result.stdout and "done" in result.stdout, result
    assert "neighbour-alive" in result.stdout
    assert "sees-neighbour" not in result.stdout
    assert "LEAK" not in result.stdout and "POD_FILE_SECRET" not in result.stdout


@pytest.mark.parametrize("fuse", [False, True], ids=["unpacked", "fuse"])
def test_with_proc_outer_the_payload_sees_the_pods_processes_but_cannot_read_them(make_pod,
                                                                                 fuse):
    result = run_with_neighbour(make_pod(seccomp="unconfined", fuse=fuse), ["--proc", "outer"])
    assert "status=0" in result.stdout and "done" in result.stdout, result
    # What SECURITY.md says it gives away: the ids and command lines of the pod's processes.
    assert "sees-neighbour" in result.stdout
    # What it does not: their environment, memory, files; nor can it signal them.
    assert "LEAK" not in result.stdout and "POD_FILE_SECRET" not in result.stdout
    assert "neighbour-alive" in result.stdout


PIDFD_PAYLOAD = r"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
tried = 0
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        cmd = open(f"/proc/{name}/cmdline", "rb").read()
    except OSError:
        continue
    if cmd != b"sleep\x004242\x00":
        continue
    tried += 1
    fd = os.open(f"/proc/{name}", os.O_RDONLY | os.O_DIRECTORY)
    rc = libc.syscall(424, fd, signal.SIGKILL, None, 0)  # pidfd_send_signal
    print("signal", rc, ctypes.get_errno())
    for f in ("environ", "mem", "maps", "auxv"):
        try:
            open(f"/proc/{name}/{f}", "rb").read(64)
            print("LEAK", f)
        except OSError as e:
            print(f, e.errno)
print("tried", tried)
"""


@pytest.mark.parametrize("fuse", [False, True], ids=["unpacked", "fuse"])
def test_with_proc_outer_a_pidfd_from_proc_cannot_signal_the_pod(make_pod, pod_images, fuse):
    python = os.environ.get("SQBOX_PYTHON_IMAGE")
    if not python:
        import test_inputs
        python = test_inputs.image("python")
    shutil.copyfile(python, Path(pod_images) / "python.sqsh")
    pod = make_pod(seccomp="unconfined", fuse=fuse)
    script = ("NEIGHBOUR=x sleep 4242 & n=$!; "
              f"/sqbox/bin/sqbox run --proc outer {POD_IMAGES}/python.sqsh -- python3 -c \"$1\"; "
              "echo status=$?; kill -0 $n && echo neighbour-alive")
    result = pod.run("sh", "-c", script, "sh", PIDFD_PAYLOAD)
    assert "status=0" in result.stdout, result
    assert "tried 1" in result.stdout
    assert "signal -1" in result.stdout  # EINVAL: not a process of its pid namespace
    assert "LEAK" not in result.stdout
    assert "neighbour-alive" in result.stdout


# ---- hostile images, unpacked without FUSE ----

def unpacking_pod(make_pod):
    return make_pod(seccomp="unconfined", proc="unmasked")


def add_image(pod_images, name, source, *extra):
    image = Path(pod_images) / name
    make_squashfs(source, image, *extra)
    return f"{POD_IMAGES}/{name}"


def patch_name(image_path, old, new):
    data = Path(image_path).read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    Path(image_path).write_bytes(data.replace(old, new))


def busybox_plus(pod_images, name, source):
    """busybox.sqsh with the files of `source` added to its root (mksquashfs appends)."""
    image = Path(pod_images) / name
    shutil.copyfile(Path(pod_images) / "busybox.sqsh", image)
    subprocess.run(["mksquashfs", str(source), str(image), "-quiet", "-all-root"], check=True,
                   stdout=subprocess.DEVNULL)
    return f"{POD_IMAGES}/{name}"


def test_symlinks_out_of_an_unpacked_image_lead_nowhere(make_pod, pod_images, tmp_path):
    source = tmp_path / "src"
    (source / "dir").mkdir(parents=True)
    os.symlink("/work", source / "abs")
    os.symlink("../../../../../../../../work", source / "up")
    os.symlink("/cache", source / "cache-link")
    os.symlink("../../../../..", source / "dir" / "dotdot")
    image = busybox_plus(pod_images, "symlinks.sqsh", source)
    pod = unpacking_pod(make_pod)
    Path(pod.work, "pod-secret").write_text("POD_FILE_SECRET\n")
    for path in ["/abs/pod-secret", "/up/pod-secret", "/dir/dotdot/work/pod-secret"]:
        result, record = pod.sqbox_run(image, "cat", path)
        assert result.returncode == 1 and "No such file" in result.stderr, result
        assert "POD_FILE_SECRET" not in result.stdout
        assert record["image_access"] == "unpacked"
    result, _ = pod.sqbox_run(image, "ls", "/cache-link/")
    assert result.returncode != 0 and result.stdout == ""
    # In the cache the links are links, stored as they were, and nothing was made beside them.
    entries = cache_entries(pod)
    assert len(entries) == 1 and ".tmp." not in entries[0]
    root = Path(pod.cache) / "images" / entries[0] / "root"
    assert os.readlink(root / "abs") == "/work"
    assert os.readlink(root / "up") == "../../../../../../../../work"
    assert os.readlink(root / "dir" / "dotdot") == "../../../../.."
    assert sorted(os.listdir(pod.work)) == ["pod-secret", "record.json"]
    assert sorted(os.listdir(pod.cache)) == ["images"]


@pytest.mark.parametrize("old,new,what", [(b"zq", b"..", "'..'"), (b"aqb", b"a/b", "'a/b'")],
                         ids=["dotdot", "slash"])
def test_an_image_with_a_name_that_is_a_path_is_refused(make_pod, pod_images, tmp_path, old,
                                                        new, what):
    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / old.decode()).write_text("payload\n")
    name = f"name-{old.decode()}.sqsh"
    add_image(pod_images, name, source, "-noI", "-noD", "-noF", "-noX")
    patch_name(Path(pod_images) / name, old, new)
    pod = unpacking_pod(make_pod)
    result, record = pod.sqbox_run(f"{POD_IMAGES}/{name}", "true")
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert "without FUSE" in line and f"the name {what}" in line, line
    assert record["started"] is False
    assert cache_entries(pod) == []  # nothing left: no entry, no temporary directory


def test_an_image_past_the_budget_is_refused_before_anything_is_written(make_pod, pod_images,
                                                                       tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    with open(source / "sparse", "wb") as f:
        f.truncate(5 << 30)  # 5 GiB of holes: a few bytes in the image
    add_image(pod_images, "sparse.sqsh", source)
    assert (Path(pod_images) / "sparse.sqsh").stat().st_size < (1 << 20)
    pod = unpacking_pod(make_pod)
    result, record = pod.sqbox_run(f"{POD_IMAGES}/sparse.sqsh", "true")
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert "more than 4.0 GiB of files" in line and "/dev/fuse" in line, line
    assert cache_entries(pod) == []


def test_setuid_bits_devices_and_hard_links_do_not_reach_the_cache(make_pod, pod_images,
                                                                   tmp_path, busybox_image):
    source = tmp_path / "src"
    source.mkdir()
    (source / "suid").write_text("#!/bin/sh\n")
    os.chmod(source / "suid", 0o6755)
    (source / "a").write_text("linked\n")
    os.link(source / "a", source / "b")
    image = add_image(pod_images, "odd.sqsh", source, "-p", "evil c 666 0 0 1 3",
                      "-p", "fifo i 666 0 0 f", "-p", "sock i 666 0 0 s")
    pod = unpacking_pod(make_pod)
    result, record = pod.sqbox_run(image, "/nonexistent")
    assert record is not None and record["image_access"] == "unpacked", result.stderr
    entry = [e for e in cache_entries(pod) if ".tmp." not in e]
    assert len(entry) == 1
    root = Path(pod.cache) / "images" / entry[0] / "root"
    names = sorted(os.listdir(root))
    assert "evil" not in names and "fifo" not in names and "sock" not in names
    assert "suid" in names and "a" in names
    for path in root.rglob("*"):
        st = os.lstat(path)
        assert not (st.st_mode & 0o6000), path
        assert not (path.is_char_device() or path.is_block_device() or path.is_fifo())
    assert os.stat(root / "suid").st_mode & 0o7777 == 0o755
    assert os.stat(root / "a").st_nlink == 1 and os.stat(root / "b").st_nlink == 1
    assert (root / "a").read_text() == (root / "b").read_text() == "linked\n"


def test_a_changed_image_is_never_served_stale(make_pod, pod_images, tmp_path):
    pod = unpacking_pod(make_pod)
    for content in ["one", "two"]:
        source = tmp_path / content
        source.mkdir()
        (source / "version").write_text(content + "\n")
        # The same path, rewritten in place (same inode): busybox plus the version file.
        busybox_plus(pod_images, "versioned.sqsh", source)
        result, record = pod.sqbox_run(f"{POD_IMAGES}/versioned.sqsh", "cat", "/version")
        assert result.returncode == 0, result.stderr
        assert result.stdout == content + "\n"
        assert record["image_access"] == "unpacked"


def test_runs_unpacking_at_once_share_one_complete_copy(make_pod):
    pod = unpacking_pod(make_pod)
    script = " ".join(
        f"/sqbox/bin/sqbox run {BUSYBOX} -- echo run{i} > /work/out{i} 2>&1 &" for i in range(3))
    result = pod.run("sh", "-c", script + " wait")
    assert result.returncode == 0, result
    for i in range(3):
        assert Path(pod.work, f"out{i}").read_text() == f"run{i}\n"
    entries = cache_entries(pod)
    assert len(entries) == 1 and ".tmp." not in entries[0] and ".old." not in entries[0]


def test_a_signal_stops_an_unpacking_and_nothing_is_left(make_pod):
    """Unpacking a large image takes minutes; sqbox holds the forwarded signals during it, and one
    that comes (here: SIGTERM, already sent as sqbox starts) stops it at once: the half-made copy
    goes, nothing runs, and sqbox ends with 143 and its record."""
    pod = unpacking_pod(make_pod)
    hold_and_send = ("import os, signal, sys; "
                     "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
                     "os.kill(os.getpid(), signal.SIGTERM); os.execv(sys.argv[1], sys.argv[1:])")
    result = pod.run("/usr/bin/python3", "-c", hold_and_send, POD_BIN, "run", "--json",
                     "/work/record.json", "--mount", "/work:/out", BUSYBOX, "--", "touch", "/out/ran")
    said = "stopped by SIGTERM before the sandbox started: nothing ran"
    assert result.returncode == 143, result.stderr
    assert one_line(result.stderr) == f"sqbox: {said}"
    record = json.loads((Path(pod.work) / "record.json").read_text())
    assert (record["exit_code"], record["started"], record["error"]) == (143, False, said)
    assert not (Path(pod.work) / "ran").exists()
    assert cache_entries(pod) == []


def test_what_a_killed_unpacking_left_behind_is_removed_by_the_next_run(make_pod):
    pod = unpacking_pod(make_pod)
    leftover = Path(pod.cache) / "images" / "0-0-0-0.0-0.0.tmp.AbCdEf"
    (leftover / "root" / "usr").mkdir(parents=True)
    (leftover / "root" / "usr" / "half-written").write_text("x" * 1000)
    # One that a run has only just made (and is about to lock) stays; an older one goes.
    young = Path(pod.cache) / "images" / "0-0-0-0.0-0.0.tmp.YoUnGg"
    young.mkdir()
    os.utime(leftover, (1, 1))
    result, record = pod.sqbox_run(BUSYBOX, "true")
    assert result.returncode == 0, result.stderr
    assert not leftover.exists()
    assert young.exists()
    assert len(cache_entries(pod)) == 2


# ---- pre-started interpreters and the zygote in a pod ----

@pytest.fixture(scope="module")
def pod_python(pod_images):
    """The project's Python image, where the pods see it."""
    target = Path(pod_images) / "python.sqsh"
    if not target.exists():
        shutil.copyfile(test_inputs.image("python"), target)
    return f"{POD_IMAGES}/python.sqsh"


@pytest.mark.parametrize("way", [["--prestart", "1"], ["--zygote"]], ids=["prestart", "zygote"])
@pytest.mark.parametrize("fuse", [False, True], ids=["no-fuse", "fuse"])
def test_run_python_ahead_of_the_request_works_in_a_pod(make_pod, pod_python, way, fuse):
    """`sqbox serve --prestart`/`--zygote` in a pod (with /dev/fuse, or from the copy unpacked
    into the cache without it): each run_python gets a sandbox made ahead that no other request
    ran in, and what one request leaves (a /tmp file, a module global) the next cannot find."""
    pod = make_pod(seccomp="unconfined", proc="unmasked", fuse=fuse)
    code = ("import os, sys; print(os.path.exists('/tmp/left'), 'left' in sys.modules);"
            "open('/tmp/left', 'w').write('x'); sys.modules['left'] = sys; print(os.getuid())")
    requests = "".join(json.dumps({"id": i, "op": "run_python", "code": code}) + "\n"
                       for i in (1, 2, 3))
    served = subprocess.run(pod._argv([POD_BIN, "serve", *way, pod_python]), input=requests,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=300)
    assert served.returncode == 0, served.stderr
    answers = {a["id"]: a for a in map(json.loads, served.stdout.splitlines()) if "id" in a}
    assert sorted(answers) == [1, 2, 3], (served.stdout, served.stderr)
    for answer in answers.values():
        assert answer["exit_code"] == 0, answer
        assert answer["stdout"] == "False False\n1000\n", answer
    # Requests that come while a sandbox is ready are handed one made ahead.
    assert any(answer["prestarted"] for answer in answers.values()), answers

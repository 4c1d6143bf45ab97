#!/usr/bin/env python3
"""Cold-start benchmark: wall time of `python3 -c pass` in a fresh sandbox.

Compares, interleaved in one run, a plain chroot into the extracted image
(native), bubblewrap with all namespaces on the extracted directory, sqbox on the
extracted directory, sqbox on the project's .sqsh image, sqbox on .sqsh images the bench
makes from the same root filesystem the way users make them (mksquashfs's defaults, enroot's
options, zstd, and with --imported-image one that `sqbox import` made from a registry; first run
with the image out of the page cache and no shared image server yet, later runs, and later
runs with an image server of their own: --image-server-idle 0), and enroot's `start` of a
created container when enroot is installed; then reports the peak RSS of sqbox's own
processes (launcher, supervisor, FUSE server, init, and the image's shared server).

Usage: bench/cold_start.py [--image PATH] [--rounds N] [--as-user USER] [--json FILE]
                           [--no-user-images] [--imported-image PATH]
                           [--enroot PATH | --no-enroot]
See bench/README.md for how to read the output.
"""

import argparse
import hashlib
import json
import math
import os
import pwd
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAYLOAD = ["python3", "-c", "pass"]
WARMUP_ROUNDS = 3
RSS_TARGET_KB = 10 * 1024  # supervisor + FUSE server budget: 10 MiB
# enroot 4.1's default ENROOT_SQUASH_OPTIONS (its enroot.conf) and the -all-root its import adds
# (src/docker.sh): how enroot users' images are made.
ENROOT_SQUASH_OPTIONS = ["-all-root", "-comp", "lzo", "-noD", "-exit-on-error"]
# The images users make: (kind, mksquashfs options, description).
USER_IMAGE_KINDS = [
    ("gzip", [], "mksquashfs defaults (gzip)"),
    ("lzo-noD", ENROOT_SQUASH_OPTIONS, "enroot's options (lzo -noD)"),
    ("zstd", ["-comp", "zstd"], "-comp zstd"),
]
# Where enroot 4.1.2 is installed when it is built from source (bench/README.md, Image import):
# not on PATH, so its helpers are put on PATH for its rows.
ENROOT_DEFAULT = "/opt/enroot-4.1.2/bin/enroot"
# Changes whenever user_images() makes different images, so cached ones are made again.
USER_IMAGES_RECIPE = "2: no warm-up list"


def die(msg):
    sys.exit(f"cold_start: {msg}")


def default_image():
    # images/build prints only the .sqsh path on stdout (build chatter goes to stderr).
    out = subprocess.run([os.path.join(REPO, "images", "build"), "python"],
                         stdout=subprocess.PIPE, check=True, text=True).stdout
    return out.strip().splitlines()[-1]


def as_user(user, cmd):
    return ["runuser", "-u", user, "--"] + cmd if user else cmd


def extract(image, workdir, user):
    """unsquashfs IMAGE into WORKDIR/rootfs and return that path.

    With --as-user the user extracts it, so it owns the files: sqbox run on a
    directory as an unprivileged user needs a rootfs that user owns (root-owned
    files map to nobody in its user namespace and cannot be replaced, e.g.
    /etc/hostname), which is also the realistic case of a user's own rootfs.
    """
    rootfs = os.path.join(workdir, "rootfs")
    if user:
        pw = pwd.getpwnam(user)
        os.chown(workdir, pw.pw_uid, pw.pw_gid)
    subprocess.run(as_user(user, ["unsquashfs", "-q", "-n", "-d", rootfs, image]),
                   stdout=subprocess.DEVNULL, check=True)
    return rootfs


def user_images(image, build_dir):
    """The USER_IMAGE_KINDS made from IMAGE's root filesystem, each twice (the second copy is
    the one the first-run rows evict: a copy, not a link, so it has page cache of its own).

    Cached in BUILD_DIR/bench-images/KEY/, KEY from the source image's path, size and mtime (and
    USER_IMAGES_RECIPE), so reruns skip mksquashfs. Made as root from a root-owned extraction, so
    every file is owned by root as in an image pulled from a registry; world-readable for
    --as-user.
    """
    st = os.stat(image)
    key = hashlib.sha256(f"{USER_IMAGES_RECIPE}\0{os.path.realpath(image)}\0{st.st_size}\0"
                         f"{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = os.path.join(build_dir, "bench-images", key)
    paths = {kind: (os.path.join(out, f"{kind}.sqsh"), os.path.join(out, f"{kind}.first.sqsh"))
             for kind, _, _ in USER_IMAGE_KINDS}
    if all(os.path.exists(p) for pair in paths.values() for p in pair):
        return paths
    if os.geteuid() != 0:
        die("making the user images needs root once (they are cached under the build "
            "directory); or pass --no-user-images")
    os.makedirs(out, mode=0o755, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="rootfs-", dir=out)
    try:
        rootfs = os.path.join(staging, "rootfs")
        subprocess.run(["unsquashfs", "-q", "-n", "-d", rootfs, image],
                       stdout=subprocess.DEVNULL, check=True)
        for kind, options, _ in USER_IMAGE_KINDS:
            made, copy = paths[kind]
            print(f"cold_start: making {made}", file=sys.stderr, flush=True)
            tmp = made + ".tmp"
            subprocess.run(["mksquashfs", rootfs, tmp, "-noappend", "-quiet", "-no-progress"]
                           + options, stdout=subprocess.DEVNULL, check=True)
            shutil.copyfile(tmp, copy + ".tmp")
            for p in (tmp, copy + ".tmp"):
                os.chmod(p, 0o644)
            os.replace(copy + ".tmp", copy)
            os.replace(tmp, made)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths


# An image imported from a registry (--imported-image): sqbox import's defaults.
IMPORTED_KIND = ("imported", None, "imported from a registry (sqbox import: zstd level 6)")


def imported_copies(path, workdir):
    """(the image, a copy of it for the first-run rows) in WORKDIR, readable by --as-user."""
    pair = (os.path.join(workdir, "imported.sqsh"), os.path.join(workdir, "imported.first.sqsh"))
    for copy in pair:
        shutil.copyfile(path, copy)
        os.chmod(copy, 0o644)
    return pair


def evict(path):
    """Drop PATH's pages from the page cache: a first run reads the image from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def shared_servers_of(image):
    """The pids of the `sqbox image-server` processes serving IMAGE (its file on their
    descriptor 3; root reads any user's)."""
    target = os.path.realpath(image)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            if argv[1:2] != [b"image-server"] or os.readlink(f"/proc/{entry}/fd/3") != target:
                continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def end_shared_servers_of(image, timeout=10.0):
    """Ends IMAGE's shared image servers and waits until they are gone: servers meet by a name
    derived from the image, so one left from the previous sample would serve the next."""
    for pid in shared_servers_of(image):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while shared_servers_of(image):
        if time.monotonic() > deadline:
            die(f"the shared image server of {image} did not end")
        time.sleep(0.01)


def first_run_preparation(image, cache):
    """Before each sample of a first-run row: no shared image server of the image left, the
    image out of the page cache, and the row's sqbox cache directory gone."""
    def prepare():
        end_shared_servers_of(image)
        shutil.rmtree(cache, ignore_errors=True)
        evict(image)
    return prepare


def find_enroot(requested):
    """(enroot path, its version) or (None, None). The default is the source build under /opt,
    else an `enroot` on PATH that is NVIDIA's: a shell script (sqbox's enroot front end, a link
    to the sqbox binary, answers `version` with an enroot release number too)."""
    candidates = [requested] if requested else [ENROOT_DEFAULT, shutil.which("enroot")]
    for path in filter(None, candidates):
        if not os.access(path, os.X_OK):
            continue
        with open(path, "rb") as f:
            if f.read(2) != b"#!":
                continue
        env = dict(os.environ, PATH=f"{os.path.dirname(path)}:{os.environ.get('PATH', '')}")
        res = subprocess.run([path, "version"], capture_output=True, text=True, env=env)
        if res.returncode == 0 and res.stdout.strip():
            return path, res.stdout.strip()
    if requested:
        die(f"{requested} is not NVIDIA's enroot (a script whose `version` works)")
    return None, None


def enroot_container(enroot, image, workdir, user, front_end=None):
    """`enroot create` of IMAGE (as USER with --as-user) in a private set of enroot
    directories; returns (name, environment for `enroot start`). FRONT_END: the argv that is
    `enroot` (sqbox's front end: [sqbox, "enroot"]), else ENROOT itself."""
    front_end = front_end or [enroot]
    base = os.path.join(workdir, "enroot" if front_end == [enroot] else "sqbox-enroot")
    env = {"PATH": f"{os.path.dirname(enroot)}:/usr/sbin:/usr/bin:/sbin:/bin"}
    for var, sub in (("ENROOT_DATA_PATH", "data"), ("ENROOT_RUNTIME_PATH", "runtime"),
                     ("ENROOT_CACHE_PATH", "cache"), ("ENROOT_CONFIG_PATH", "config"),
                     ("ENROOT_TEMP_PATH", "tmp")):
        env[var] = os.path.join(base, sub)
    os.makedirs(env["ENROOT_TEMP_PATH"])
    if user:
        pw = pwd.getpwnam(user)
        for root, dirs, _ in os.walk(base):
            for d in [root] + [os.path.join(root, d) for d in dirs]:
                os.chown(d, pw.pw_uid, pw.pw_gid)
    name = "bench"
    res = subprocess.run(as_user(user, front_end + ["create", "--name", name, image]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, **env))
    if res.returncode != 0:
        die(f"enroot create failed ({res.returncode}): {res.stderr.strip()}")
    return name, env


def commands(sqbox, image, rootfs, user, caches, compare=None, switch=None,
             made=None, enroot=None, sqbox_enroot=None, kinds=USER_IMAGE_KINDS):
    """(name, argv, environment) for each row; every row goes through runuser when --as-user.

    Each sqbox row has its own SQBOX_CACHE_DIR, empty when measuring starts, where the .sqsh
    rows' shared image servers keep their sockets.
    """
    if os.geteuid() == 0 and not user:
        native = ("native (chroot)", ["chroot", rootfs] + PAYLOAD)
    else:
        # chroot needs CAP_SYS_CHROOT: take it in a fresh user namespace.
        native = ("native (unshare -r chroot)", ["unshare", "-r", "chroot", rootfs] + PAYLOAD)
    rows = [
        native + (None,),
        ("bwrap --unshare-all (dir)",
         ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
          "--bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
         + PAYLOAD, None),
        ("sqbox run IMAGE.sqsh", [sqbox, "run", image, "--"] + PAYLOAD,
         {"SQBOX_CACHE_DIR": caches["sqsh"]}),
        ("sqbox run ROOTFS (dir)", [sqbox, "run", rootfs, "--"] + PAYLOAD,
         {"SQBOX_CACHE_DIR": caches["dir"]}),
    ]
    for kind, _, description in kinds if made else []:
        warm, first = made[kind]
        # A first run starts the image's shared server (docs/run.md); it leaves 1 s after, so
        # none is left from one sample to the next.
        rows.append((f"{FIRST_ROW_PREFIX}{description}",
                     [sqbox, "run", first, "--"] + PAYLOAD,
                     {"SQBOX_CACHE_DIR": caches[f"first-{kind}"], "SQBOX_IMAGE_SERVER_IDLE": "1"}))
        rows.append((f"{LATER_ROW_PREFIX}{description}",
                     [sqbox, "run", warm, "--"] + PAYLOAD,
                     {"SQBOX_CACHE_DIR": caches[f"later-{kind}"]}))
        # What later runs took before the shared server: a server (and page cache) of their own.
        rows.append((f"{OWN_SERVER_ROW_PREFIX}{description}",
                     [sqbox, "run", "--image-server-idle", "0", warm, "--"] + PAYLOAD,
                     {"SQBOX_CACHE_DIR": caches[f"later-{kind}"]}))
    if sqbox_enroot:
        # A harness that calls `enroot start` gets sqbox's front end (docs/enroot.md): the same
        # launcher as `sqbox run`, so later runs share the container image's server too.
        name, env = sqbox_enroot
        rows.append((SQBOX_ENROOT_ROW, [sqbox, "enroot", "start", name] + PAYLOAD,
                     dict(env, SQBOX_CACHE_DIR=caches["enroot"])))
        # enroot runs the command through the container's login shell by default, whose
        # /etc/profile and ~/.profile start programs of their own (Debian's: id twice, mesg).
        rows.append((SQBOX_ENROOT_NO_LOGIN_ROW, [sqbox, "enroot", "start", name] + PAYLOAD,
                     dict(env, SQBOX_CACHE_DIR=caches["enroot"], ENROOT_LOGIN_SHELL="no")))
    if enroot:
        path, name, env = enroot
        rows.append((ENROOT_ROW, [path, "start", name] + PAYLOAD, env))
    if compare:
        # Another build of sqbox (e.g. an older commit), to measure what a change costs.
        rows.append(("compare: sqbox run IMAGE.sqsh", [compare, "run", image, "--"] + PAYLOAD,
                     {"SQBOX_CACHE_DIR": caches["compare"]}))
    if switch:
        # One build with bench/hardening-switch.patch, with its hardening and without: the
        # same binary in both rows, so only the hardening differs.
        for row, extra in ((HARDENED_ROW, {}),
                           (UNHARDENED_ROW, {"SQBOX_BENCH_WITHOUT_HARDENING": "1"})):
            rows.append((row, [switch, "run", image, "--"] + PAYLOAD,
                         {"SQBOX_CACHE_DIR": caches["switch"], **extra}))
    return [(name, as_user(user, argv), env) for name, argv, env in rows]


HARDENED_ROW = "switch build: sqbox run IMAGE.sqsh"
FIRST_ROW_PREFIX = "first run: sqbox run "
LATER_ROW_PREFIX = "later runs: sqbox run "
OWN_SERVER_ROW_PREFIX = "later runs, own server: sqbox run "
ENROOT_ROW = "enroot start (created container)"
SQBOX_ENROOT_ROW = "later runs: sqbox enroot start (created container, lzo -noD)"
SQBOX_ENROOT_NO_LOGIN_ROW = "the same, ENROOT_LOGIN_SHELL=no"
UNHARDENED_ROW = "switch build, without hardening"


def time_once(argv, env=None):
    full_env = dict(os.environ, **env) if env else None
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=full_env)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        # Rerun with stderr visible so the failure is diagnosable.
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=full_env)
        die(f"exit {res.returncode}: {' '.join(argv)}\n{res.stderr}")
    return dt * 1000.0


def measure(rows, rounds, preparations=None):
    """Round-robin: one sample of each row per round, so machine noise hits all rows alike.
    PREPARATIONS maps a row to what runs, untimed, before each of its samples."""
    samples = {name: [] for name, _, _ in rows}
    n = len(rows)
    for r in range(WARMUP_ROUNDS + rounds):
        # Rotate the starting row each round so no row always runs right after another.
        for i in range(n):
            name, argv, env = rows[(r + i) % n]
            if preparations and name in preparations:
                preparations[name]()
            ms = time_once(argv, env)
            if r >= WARMUP_ROUNDS:
                samples[name].append(ms)
    return samples


def measure_pairs(rows, rounds):
    """Only the two rows of --hardening-switch, back to back, for many rounds: a sub-millisecond
    difference needs thousands of pairs here. Which goes first alternates."""
    switch_rows = [row for row in rows if row[0] in (HARDENED_ROW, UNHARDENED_ROW)]
    samples = {name: [] for name, _, _ in switch_rows}
    for r in range(WARMUP_ROUNDS + rounds):
        for name, argv, env in (switch_rows if r % 2 == 0 else switch_rows[::-1]):
            ms = time_once(argv, env)
            if r >= WARMUP_ROUNDS:
                samples[name].append(ms)
    return samples


def median_with_interval(values):
    """The median and a 95 % confidence interval for it: the order statistics the binomial
    distribution puts 1.96 standard deviations either side of the middle (no assumption about
    the samples' distribution)."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half_width))
    high = min(n - 1, math.ceil(n / 2 + half_width) - 1)
    return statistics.median(ordered), ordered[low], ordered[high]


def summarize(values):
    dec = statistics.quantiles(values, n=10, method="inclusive")
    return {"median": statistics.median(values), "p10": dec[0], "p90": dec[8]}


# ---- peak RSS of sqbox's own processes ----

def read_children(pid):
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass
    return kids


def comm(pid):
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def vm_hwm_kb(pid):
    # /proc/PID/status stays readable (0444) even for the non-dumpable supervisor and init.
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def descendants(pid):
    out = []
    for c in read_children(pid):
        out += [c] + descendants(c)
    return out


def shared_server_processes(user):
    """(server, its FUSE server) of the shared image server that the RSS run (as USER) used: the
    newest of USER's (servers meet at abstract socket names, not in a cache directory, so an
    earlier row's server of another image or binary may be running too)."""
    uid = pwd.getpwnam(user).pw_uid if user else os.geteuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/status") as f:  # not /proc/PID's owner: not dumpable
                owner = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            with open(f"/proc/{entry}/stat") as f:
                started = int(f.read().rpartition(")")[2].split()[19])
        except OSError:
            continue
        if argv[1:3] == [b"image-server", b"--socket"] and owner == uid:
            kids = read_children(int(entry))
            if kids:  # the server, not its FUSE server (which has none)
                found.append((started, int(entry), kids[0]))
    if not found:
        die(f"no shared image server of {user or 'this user'}")
    _, server, parser = max(found)
    return server, parser


def measure_rss(sqbox, image, user, cache):
    """Peak RSS (kB) of launcher, supervisor, FUSE server and init while the payload sleeps; with
    the image's shared server, of that server too."""
    script = 'import time; print("ready", flush=True); time.sleep(2)'
    argv = as_user(user, [sqbox, "run", image, "--", "python3", "-c", script])
    sq_comm = os.path.basename(sqbox)[:15]  # comm is the exe name, truncated to 15 chars
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, SQBOX_CACHE_DIR=cache))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            proc.kill()
            die(f"payload never said ready: {proc.communicate()[1].decode(errors='replace')}")

        # Skip runuser (with --as-user) down to the first sqbox process: the launcher.
        launcher = proc.pid
        while comm(launcher) != sq_comm:
            kids = read_children(launcher)
            if len(kids) != 1:
                die(f"cannot find the sqbox launcher below pid {proc.pid}")
            launcher = kids[0]
        kids = [k for k in read_children(launcher) if comm(k) == sq_comm]
        if len(kids) != 1:
            die(f"expected one supervisor below launcher {launcher}, found {kids}")
        supervisor = kids[0]

        rss = {"launcher": vm_hwm_kb(launcher), "supervisor": vm_hwm_kb(supervisor)}
        pids = {"launcher": launcher, "supervisor": supervisor}
        fuse = []
        for k in read_children(supervisor):
            if comm(k) != sq_comm:
                continue
            # init is the sqbox child whose subtree holds the payload (comm python3).
            if any(comm(d) == "python3" for d in descendants(k)):
                rss["init"], pids["init"] = vm_hwm_kb(k), k
            else:
                fuse.append(k)
        if len(fuse) > 1 or "init" not in rss:
            die(f"unexpected process tree below supervisor {supervisor}")
        if not fuse:  # the image's shared server serves it
            server, parser = shared_server_processes(user)
            rss["shared_server"], pids["shared_server"] = vm_hwm_kb(server), server
            fuse = [parser]
        rss["fuse_server"], pids["fuse_server"] = vm_hwm_kb(fuse[0]), fuse[0]
    finally:
        _, err = proc.communicate(timeout=30)
    if proc.returncode != 0:
        die(f"rss run exited {proc.returncode}: {err.decode(errors='replace')}")
    return rss, pids


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help=".sqsh image (default: images/build python)")
    ap.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"),
                    help="sqbox binary (default: build/sqbox)")
    ap.add_argument("--rounds", type=int, default=40, help="measured rounds (default 40)")
    ap.add_argument("--as-user", metavar="USER",
                    help="run every row via `runuser -u USER --` (needs root)")
    ap.add_argument("--json", metavar="FILE", help="also write all figures to FILE")
    ap.add_argument("--compare", metavar="SQBOX",
                    help="another sqbox binary to measure in the same rounds (e.g. a build of "
                         "an older commit)")
    ap.add_argument("--hardening-switch", metavar="SQBOX",
                    help="a build with bench/hardening-switch.patch: measure it with and without "
                         "its hardening in the same rounds, and print what the hardening costs")
    ap.add_argument("--switch-rounds", type=int, default=0, metavar="N",
                    help="with --hardening-switch: N more rounds of only its two rows, whose "
                         "pairs join the hardening figure (single pairs differ by about 9 ms "
                         "here, so 2000 pairs still leave an interval of about +-0.5 ms)")
    ap.add_argument("--no-user-images", action="store_true",
                    help="leave out the rows of images made with mksquashfs here (gzip, "
                         "enroot's lzo -noD, zstd; cached under the build directory)")
    ap.add_argument("--imported-image", metavar="PATH",
                    help="also the rows of an image imported from a registry by `sqbox import` "
                         "(bench/import.py --keep-image PATH makes one from the same root "
                         "filesystem)")
    ap.add_argument("--enroot", metavar="PATH",
                    help=f"NVIDIA enroot for the `enroot start` row (default: {ENROOT_DEFAULT} "
                         "when it exists, else an `enroot` on PATH that is not sqbox's)")
    ap.add_argument("--no-enroot", action="store_true", help="leave out the enroot row")
    args = ap.parse_args()

    if args.rounds < 2:
        die("--rounds must be at least 2")
    if args.switch_rounds < 0:
        die("--switch-rounds must be 0 or more")
    if args.switch_rounds and not args.hardening_switch:
        die("--switch-rounds needs --hardening-switch")
    if args.as_user and os.geteuid() != 0:
        die("--as-user needs root (runuser)")
    sqbox = os.path.abspath(args.sqbox)
    if not os.access(sqbox, os.X_OK):
        die(f"no sqbox binary at {sqbox}; build it with `cmake --build build`")
    image = os.path.abspath(args.image) if args.image else default_image()
    if args.enroot and args.no_enroot:
        die("--enroot and --no-enroot exclude each other")
    enroot, enroot_version = (None, None) if args.no_enroot else find_enroot(args.enroot)
    made = None if args.no_user_images else user_images(image, os.path.dirname(sqbox))
    if args.imported_image and not made:
        die("--imported-image needs the user images (leave out --no-user-images)")
    kinds = USER_IMAGE_KINDS + ([IMPORTED_KIND] if args.imported_image else [])

    workdir = tempfile.mkdtemp(prefix="sqbox-bench-")
    try:
        rootfs = extract(image, workdir, args.as_user)
        if args.imported_image:
            made = dict(made, imported=imported_copies(args.imported_image, workdir))
        compare = os.path.abspath(args.compare) if args.compare else None
        switch = os.path.abspath(args.hardening_switch) if args.hardening_switch else None
        caches = {kind: os.path.join(workdir, f"cache-{kind}")
                  for kind in ["sqsh", "dir", "compare", "switch", "rss", "enroot"]
                  + [f"{when}-{kind}" for when in ("first", "later")
                     for kind, _, _ in kinds]}
        enroot_row = None
        if enroot:
            # enroot's own kind of image, unpacked by its create as its users do.
            source = made["lzo-noD"][0] if made else image
            enroot_row = (enroot,) + enroot_container(enroot, source, workdir, args.as_user)
        sqbox_enroot = None
        if made:
            # The image enroot users have, created as a container by sqbox's front end.
            sqbox_enroot = enroot_container(sqbox, made["lzo-noD"][0], workdir, args.as_user,
                                            front_end=[sqbox, "enroot"])
        rows = commands(sqbox, image, rootfs, args.as_user, caches, compare, switch,
                        made, enroot_row, sqbox_enroot, kinds)
        preparations = {}
        for kind, _, description in kinds if made else []:
            preparations[f"{FIRST_ROW_PREFIX}{description}"] = \
                first_run_preparation(made[kind][1], caches[f"first-{kind}"])
        samples = measure(rows, args.rounds, preparations)
        extra_pairs = measure_pairs(rows, args.switch_rounds) if args.switch_rounds else None
        # A first run (its cache directory is empty): it starts the image's shared server.
        rss, pids = measure_rss(sqbox, image, args.as_user, caches["rss"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    stats = {name: summarize(v) for name, v in samples.items()}
    names = [name for name, _, _ in rows]
    native, bwrap, sq_img = names[0], names[1], names[2]
    for name in names:
        stats[name]["x_native"] = stats[name]["median"] / stats[native]["median"]
        stats[name]["x_bwrap"] = stats[name]["median"] / stats[bwrap]["median"]

    via = f", every row via runuser -u {args.as_user}" if args.as_user else ""
    print(f"image: {image}")
    if made:
        print(f"user images (made here from its root filesystem): "
              f"{os.path.dirname(made['gzip'][0])}")
    print(f"enroot: {f'{enroot} ({enroot_version})' if enroot else 'not found or not asked for'}")
    print(f"{args.rounds} rounds (+{WARMUP_ROUNDS} warm-up), interleaved{via}; "
          f"times are wall ms of `{' '.join(PAYLOAD)}`")
    print()
    w = max(len(n) for n in names)
    print(f"{'row':<{w}}  {'median':>8}  {'p10':>8}  {'p90':>8}  {'x native':>8}  {'x bwrap':>8}")
    for name in names:
        s = stats[name]
        print(f"{name:<{w}}  {s['median']:8.2f}  {s['p10']:8.2f}  {s['p90']:8.2f}  "
              f"{s['x_native']:8.2f}  {s['x_bwrap']:8.2f}")
    print()
    print(f"sqbox cold start: {stats[sq_img]['x_native']:.2f} x native, "
          f"{stats[sq_img]['x_bwrap']:.2f} x bubblewrap")
    hardening = None
    if args.hardening_switch:
        # Per round, the two rows ran back to back: the median of their differences is less
        # noisy than the difference of the medians (both are printed).
        paired = [on - off for on, off in zip(samples[HARDENED_ROW], samples[UNHARDENED_ROW])]
        if extra_pairs:
            paired += [on - off for on, off in
                       zip(extra_pairs[HARDENED_ROW], extra_pairs[UNHARDENED_ROW])]
        median, low, high = median_with_interval(paired)
        hardening = {
            "pairs": len(paired),
            "paired_median_ms": median,
            "paired_median_interval_95_ms": [low, high],
            "paired_mean_ms": statistics.mean(paired),
            "difference_of_medians_ms":
                stats[HARDENED_ROW]["median"] - stats[UNHARDENED_ROW]["median"],
        }
        print(f"hardening cost (switch build, with minus without, {len(paired)} pairs): "
              f"{median:.2f} ms median of per-round differences (95 % interval {low:.2f} to "
              f"{high:.2f}; mean {hardening['paired_mean_ms']:.2f}), "
              f"{hardening['difference_of_medians_ms']:.2f} ms difference of medians of the "
              f"{args.rounds} interleaved rounds")
    print()

    # The target is per sandbox: its supervisor and the FUSE server it uses. The shared image
    # server's own process serves every sandbox of the image and is listed beside it.
    own = rss["supervisor"] + rss["fuse_server"]
    print("peak RSS (VmHWM) of sqbox's processes, sqbox run IMAGE.sqsh:")
    for role in ("launcher", "supervisor", "shared_server", "fuse_server", "init"):
        if role in rss:
            print(f"  {role:<13} pid {pids[role]:<8} {rss[role]:>7} kB")
    verdict = "within" if own <= RSS_TARGET_KB else "OVER"
    print(f"  supervisor + FUSE server: {own} kB ({own / 1024:.1f} MiB), "
          f"{verdict} the 10 MiB target ({RSS_TARGET_KB} kB)")
    if "shared_server" in rss:
        print(f"  the FUSE server and the shared server's process ({rss['shared_server']} kB) "
              f"are one per image, not per sandbox")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "image": image, "sqbox": sqbox, "rounds": args.rounds,
                "user_images": made,
                "enroot": {"path": enroot, "version": enroot_version} if enroot else None,
                "warmup_rounds": WARMUP_ROUNDS, "as_user": args.as_user,
                "rows": [{"name": name, "argv": argv, "environment": env,
                          "samples_ms": samples[name], **stats[name]}
                         for name, argv, env in rows],
                "sqbox_x_native": stats[sq_img]["x_native"],
                "sqbox_x_bwrap": stats[sq_img]["x_bwrap"],
                "hardening_cost": hardening,
                "switch_rounds": args.switch_rounds,
                "switch_pairs_ms": extra_pairs,
                "rss_kb": rss, "rss_pids": pids,
                "supervisor_plus_fuse_kb": own, "rss_target_kb": RSS_TARGET_KB,
            }, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

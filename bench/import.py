#!/usr/bin/env python3
"""Image import benchmark: `sqbox import docker://...` from a registry on loopback.

Builds a Python image of several layers (base system, Python's standard library, its bytecode,
application dependencies, a small final layer) from the project's python test image, pushes it
with skopeo to Debian's docker-registry started on 127.0.0.1, then measures in the same rounds:
`sqbox import` with an empty layer cache (cold) and again with the same cache (cached layers); a
baseline pipeline doing what enroot's import does without enroot (skopeo copy + umoci unpack
--rootless + mksquashfs with enroot's options); NVIDIA enroot's own `import` when `enroot` is
found. Wall time and peak RSS (the largest process of the command's tree, from wait4's rusage).
A second image, the same layers plus one of random file data, shows whether memory stays flat.

Usage: bench/import.py [--rounds N] [--sqbox PATH] [--enroot PATH] [--big-mb N] [--json FILE]
                       [--keep-image PATH]
See bench/README.md ("Image import") for how to read the output.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY = "bench/python"
# enroot 4.1's default ENROOT_SQUASH_OPTIONS, with the options its import adds (enroot.in,
# src/docker.sh): what the baseline pipeline gives mksquashfs.
ENROOT_SQUASH_OPTIONS = ["-comp", "lzo", "-noD", "-exit-on-error"]


def die(msg):
    sys.exit(f"import bench: {msg}")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def need(command, package):
    if not shutil.which(command):
        die(f"needs `{command}` (Debian package {package})")


def run(argv, **kwargs):
    subprocess.run(argv, check=True, **kwargs)


def default_image():
    out = subprocess.run([os.path.join(REPO, "images", "build"), "python"],
                         stdout=subprocess.PIPE, check=True, text=True).stdout
    return out.strip().splitlines()[-1]


def as_root(argv):
    """chroot needs CAP_SYS_CHROOT: take it in a user namespace of our own when not root."""
    return argv if os.geteuid() == 0 else ["unshare", "-r"] + argv


# ---- the image ----

def tar_layer(rootfs, out, paths=None, excludes=(), files_from=None):
    """An uncompressed tar of PATHS (or FILES_FROM, NUL-separated) relative to ROOTFS."""
    argv = ["tar", "-C", rootfs, "--numeric-owner", "--xattrs", "-cf", out]
    if os.geteuid() != 0:
        argv += ["--owner=0", "--group=0"]  # the files are the caller's after unsquashfs
    argv += [f"--exclude={e}" for e in excludes]
    if files_from:
        argv += ["--null", "-T", files_from]
    else:
        argv += paths
    run(argv)
    return os.path.getsize(out)


def build_layers(image, workdir, big_mb):
    """Layer tars (base first) of the Python image, and the big image's extra layer."""
    rootfs = os.path.join(workdir, "rootfs")
    log(f"unsquashfs {image}")
    run(["unsquashfs", "-q", "-n", "-d", rootfs, image], stdout=subprocess.DEVNULL)
    stdlib = "usr/lib/python3.11"
    if not os.path.isdir(os.path.join(rootfs, stdlib)):
        die(f"the image has no /{stdlib}")
    # Bytecode for all optimisation levels, as images that compile their standard library carry.
    log("compileall (bytecode layer)")
    subprocess.run(as_root(["chroot", rootfs, "python3", "-m", "compileall", "-q", "-o", "0",
                            "-o", "1", "-o", "2", "/" + stdlib]),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # A stand-in for pip-installed pure-Python packages: copies of standard library packages
    # under site-packages (the same kind of files: many small .py files with their bytecode).
    site = os.path.join(rootfs, "usr/local/lib/python3.11/site-packages")
    os.makedirs(site, exist_ok=True)
    for package in ("asyncio", "email", "encodings", "json", "xml", "unittest", "concurrent",
                    "http", "logging", "multiprocessing", "importlib", "pydoc_data",
                    "tomllib", "sqlite3", "urllib", "ctypes", "curses", "dbm", "html",
                    "wsgiref", "xmlrpc", "zoneinfo", "lib2to3", "idlelib", "ensurepip"):
        source = os.path.join(rootfs, stdlib, package)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(site, "vendored_" + package), symlinks=True)
    app = os.path.join(rootfs, "app")
    os.makedirs(app)
    with open(os.path.join(app, "main.py"), "w") as f:
        f.write("import json, sys\nprint(json.dumps({'python': sys.version}))\n")
    # The final layer also deletes the documentation, as slim images do (an OCI whiteout).
    whiteout_dir = os.path.join(workdir, "whiteout")
    os.makedirs(os.path.join(whiteout_dir, "usr/share"))
    open(os.path.join(whiteout_dir, "usr/share/.wh.doc"), "w").close()
    shutil.copytree(app, os.path.join(whiteout_dir, "app"))

    pycache_list = os.path.join(workdir, "pycache.list")
    found = subprocess.run(["find", stdlib, "-name", "__pycache__", "-print0"], cwd=rootfs,
                           stdout=subprocess.PIPE, check=True).stdout
    with open(pycache_list, "wb") as f:
        f.write(found)

    layers = []
    def add(name, size):
        layers.append((name, os.path.join(workdir, f"{name}.tar"), size))

    log("tar layers")
    add("base system", tar_layer(rootfs, os.path.join(workdir, "base system.tar"), ["."],
                                 excludes=["./" + stdlib, "./usr/local/lib/python3.11",
                                           "./app"]))
    add("python stdlib", tar_layer(rootfs, os.path.join(workdir, "python stdlib.tar"),
                                   [stdlib], excludes=["__pycache__"]))
    add("bytecode", tar_layer(rootfs, os.path.join(workdir, "bytecode.tar"),
                              files_from=pycache_list))
    add("dependencies", tar_layer(rootfs, os.path.join(workdir, "dependencies.tar"),
                                  ["usr/local/lib/python3.11"]))
    add("app", tar_layer(whiteout_dir, os.path.join(workdir, "app.tar"), ["."]))
    shutil.rmtree(rootfs)

    # Random (incompressible) file data: what a model or data layer looks like to the importer.
    data = os.path.join(workdir, "data")
    os.makedirs(os.path.join(data, "data"))
    chunk = 100
    for i in range((big_mb + chunk - 1) // chunk):
        size = min(chunk, big_mb - i * chunk) << 20
        with open(os.path.join(data, "data", f"blob{i}.bin"), "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
    big_layer = ("random data", os.path.join(workdir, "random.tar"),
                 tar_layer(data, os.path.join(workdir, "random.tar"), ["."]))
    shutil.rmtree(data)
    return layers, big_layer


def build_layout(layers, big_layer, layout):
    """An OCI layout with tags `bench` (LAYERS) and `bench-big` (LAYERS + BIG_LAYER)."""
    log("umoci: layout, layers (gzip), config")
    run(["umoci", "init", "--layout", layout])
    run(["umoci", "new", "--image", f"{layout}:bench"])
    for name, path, _ in layers:
        run(["umoci", "raw", "add-layer", "--history.created_by", name, "--image",
             f"{layout}:bench", path])
    run(["umoci", "config", "--image", f"{layout}:bench", "--config.cmd", "python3",
         "--config.cmd", "/app/main.py", "--config.workingdir", "/app",
         "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
         "--config.env", "LANG=C.UTF-8", "--config.label", "org.example.bench=import"])
    run(["umoci", "raw", "add-layer", "--history.created_by", big_layer[0], "--image",
         f"{layout}:bench", "--tag", "bench-big", big_layer[1]])


def compressed_sizes(layout, tag):
    """The layer blobs' sizes of TAG in LAYOUT, base first."""
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    entry = next(m for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    with open(os.path.join(layout, "blobs", "sha256", entry["digest"][7:])) as f:
        manifest = json.load(f)
    return [layer["size"] for layer in manifest["layers"]]


# ---- the registry (as tests/registry/registry_servers.py starts it) ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, workdir):
        self.address = f"127.0.0.1:{free_port()}"
        os.makedirs(workdir)
        config = os.path.join(workdir, "config.yml")
        with open(config, "w") as f:
            f.write("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                    f"storage:\n  filesystem:\n    rootdirectory: {workdir}/storage\n"
                    f"http:\n  addr: {self.address}\n")
        self.log = open(os.path.join(workdir, "registry.log"), "w")
        self.process = subprocess.Popen(["docker-registry", "serve", config],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2)
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    die(f"docker-registry did not start (see {workdir}/registry.log)")
                time.sleep(0.1)

    def push(self, layout, tag):
        # As Docker's v2 schema 2 manifest (what `docker push` makes): enroot 4.1's first
        # request (its authentication probe) names no manifest type, and docker-registry 2.8
        # answers 404 to that for an OCI manifest.
        run(["skopeo", "--insecure-policy", "copy", "-q", "--dest-tls-verify=false",
             "--format", "v2s2",
             f"oci:{layout}:{tag}", f"docker://{self.address}/{REPOSITORY}:{tag}"],
            stdout=subprocess.DEVNULL)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


# ---- the measured commands ----

def measure(argv, env, log_path):
    """Wall seconds and peak RSS (kB) of ARGV: wait4's ru_maxrss covers the process and every
    descendant it waited for, and is the largest of them (not their sum)."""
    with open(log_path, "ab") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        die(f"{' '.join(argv)} exited {proc.returncode}:\n{tail}")
    return elapsed, usage.ru_maxrss


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENROOT_", "SQBOX_")) and k not in ("DOCKER_CONFIG",)}
    env.update(extra)
    return env


class Tool:
    """One importer: `cold` with an empty layer cache, then `cached` with the same cache."""

    def __init__(self, name, workdir):
        self.name = name
        self.workdir = os.path.join(workdir, name.replace(" ", "-"))
        os.makedirs(self.workdir)
        self.log = os.path.join(self.workdir, "output.log")

    def fresh(self, path):
        path = os.path.join(self.workdir, path)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):
            os.remove(path)
        return path


class Sqbox(Tool):
    def __init__(self, sqbox, registry, workdir, tag="bench", name="sqbox import", options=()):
        super().__init__(name, workdir)
        self.sqbox, self.uri = sqbox, f"docker://{registry.address}#{REPOSITORY}:{tag}"
        self.options = list(options)

    def environment(self):
        return clean_env(ENROOT_CACHE_PATH=os.path.join(self.workdir, "cache"),
                         ENROOT_ALLOW_HTTP="y",
                         ENROOT_CONFIG_PATH=os.path.join(self.workdir, "config"))

    def sample(self, cached):
        if not cached:
            self.fresh("cache")
        out = self.fresh("out.sqsh")
        result = measure([self.sqbox, "import", *self.options, "-o", out, self.uri],
                         self.environment(), self.log)
        self.size = os.path.getsize(out)
        os.remove(out)
        return result


class Baseline(Tool):
    """skopeo copy into an OCI layout (its blobs are the layer cache), umoci unpack
    --rootless, mksquashfs with enroot's options: one shell, so one wait4."""

    def __init__(self, registry, workdir):
        super().__init__("skopeo+umoci+mksquashfs", workdir)
        self.source = f"docker://{registry.address}/{REPOSITORY}:bench"

    def sample(self, cached):
        layout = os.path.join(self.workdir, "layout")
        if not cached:
            self.fresh("layout")
        bundle, out = self.fresh("bundle"), self.fresh("out.sqsh")
        script = (
            'skopeo --insecure-policy copy -q --src-tls-verify=false "$1" "oci:$2:bench" && '
            'umoci unpack --rootless --image "$2:bench" "$3" && '
            'mksquashfs "$3/rootfs" "$4" -all-root -no-progress -quiet '
            f'-processors {os.cpu_count()} {" ".join(ENROOT_SQUASH_OPTIONS)} '
            "-e dev")
        result = measure(["sh", "-c", script, "sh", self.source, layout, bundle, out],
                         clean_env(), self.log)
        self.size = os.path.getsize(out)
        shutil.rmtree(bundle)
        os.remove(out)
        return result


class Enroot(Tool):
    def __init__(self, enroot, registry, workdir):
        super().__init__("enroot import", workdir)
        self.enroot, self.uri = enroot, f"docker://{registry.address}#{REPOSITORY}:bench"
        for d in ("config", "data", "runtime", "tmp"):
            os.makedirs(os.path.join(self.workdir, d))

    def sample(self, cached):
        cache = os.path.join(self.workdir, "cache")
        if not cached:
            self.fresh("cache")
            os.makedirs(cache)
        out = self.fresh("out.sqsh")
        w = self.workdir
        env = clean_env(ENROOT_CACHE_PATH=cache, ENROOT_ALLOW_HTTP="y",
                        ENROOT_CONFIG_PATH=f"{w}/config", ENROOT_DATA_PATH=f"{w}/data",
                        ENROOT_RUNTIME_PATH=f"{w}/runtime", ENROOT_TEMP_PATH=f"{w}/tmp")
        result = measure([self.enroot, "import", "-o", out, self.uri], env, self.log)
        self.size = os.path.getsize(out)
        os.remove(out)
        return result


def enroot_version(enroot):
    try:
        return subprocess.run([enroot, "version"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="the .sqsh to build the image from "
                    "(default: images/build python)")
    ap.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"),
                    help="sqbox binary (default: build/sqbox)")
    ap.add_argument("--enroot", help="enroot to compare with (default: `enroot` on PATH, "
                    "if any)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    ap.add_argument("--big-mb", type=int, default=300,
                    help="MB of random file data in the big image's extra layer (default 300)")
    ap.add_argument("--json", metavar="FILE", help="also write every sample and figure")
    ap.add_argument("--keep-image", metavar="PATH",
                    help="also leave at PATH the image `sqbox import` makes (its defaults), for "
                         "bench/cold_start.py --imported-image")
    args = ap.parse_args()
    if args.rounds < 1:
        die("--rounds must be at least 1")
    for command, package in (("skopeo", "skopeo"), ("umoci", "umoci"),
                             ("docker-registry", "docker-registry"),
                             ("unsquashfs", "squashfs-tools"), ("mksquashfs", "squashfs-tools"),
                             ("tar", "tar")):
        need(command, package)
    sqbox = os.path.abspath(args.sqbox)
    if not os.access(sqbox, os.X_OK):
        die(f"no sqbox binary at {sqbox}; build it with `cmake --build build`")
    enroot = args.enroot or shutil.which("enroot")
    version = enroot_version(enroot) if enroot else None
    if args.enroot and not version:
        die(f"`{args.enroot} version` failed")
    image = os.path.abspath(args.image) if args.image else default_image()

    workdir = tempfile.mkdtemp(prefix="sqbox-import-bench-")
    registry = None
    try:
        layers, big_layer = build_layers(image, workdir, args.big_mb)
        layout = os.path.join(workdir, "layout")
        build_layout(layers, big_layer, layout)
        sizes = compressed_sizes(layout, "bench")
        big_sizes = compressed_sizes(layout, "bench-big")
        for _, path, _ in layers + [big_layer]:
            os.remove(path)
        registry = Registry(os.path.join(workdir, "registry"))
        log(f"skopeo: push to {registry.address}")
        registry.push(layout, "bench")
        registry.push(layout, "bench-big")
        shutil.rmtree(layout)

        tools = [Sqbox(sqbox, registry, workdir), Baseline(registry, workdir)]
        if version:
            tools.append(Enroot(enroot, registry, workdir))
        # enroot's flavour of squashfs: file data stored, not compressed.
        stored = Sqbox(sqbox, registry, workdir, name="sqbox import --compression none",
                       options=["--compression", "none"])
        big = Sqbox(sqbox, registry, workdir, tag="bench-big", name="sqbox import (big)")
        groups = tools + [stored, big]
        samples = {(t.name, mode): [] for t in groups for mode in ("cold", "cached")}
        load_before = os.getloadavg()
        # One warm-up round (discarded): the registry's files into the page cache, the
        # programs' first start. Then interleaved rounds, each starting at the next tool.
        for number in range(args.rounds + 1):
            order = groups[number % len(groups):] + groups[:number % len(groups)]
            for tool in order:
                for mode in ("cold", "cached"):
                    wall, rss = tool.sample(cached=(mode == "cached"))
                    if number:
                        samples[(tool.name, mode)].append((wall, rss))
            log(f"round {number}/{args.rounds}" + (" (warm-up)" if not number else ""))
        load_after = os.getloadavg()
        output_sizes = {t.name: t.size for t in groups}
        if args.keep_image:
            keep = os.path.abspath(args.keep_image)
            run([sqbox, "import", "-o", keep + ".tmp", tools[0].uri],
                env=tools[0].environment(), stdout=subprocess.DEVNULL)
            os.chmod(keep + ".tmp", 0o644)
            os.replace(keep + ".tmp", keep)
            log(f"kept the imported image at {keep}")
    finally:
        if registry:
            registry.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    mib = 1 << 20
    uncompressed = sum(size for _, _, size in layers)
    print(f"image {REPOSITORY}:bench from {image}: {len(layers)} layers, "
          f"{uncompressed / mib:.0f} MiB as tar, {sum(sizes) / mib:.0f} MiB gzip-compressed")
    for (name, _, size), compressed in zip(layers, sizes):
        print(f"  {name:<14} {size / mib:7.1f} MiB tar  {compressed / mib:7.1f} MiB gzip")
    print(f"image {REPOSITORY}:bench-big: the same plus {big_layer[0]} "
          f"({big_layer[2] / mib:.0f} MiB tar, {big_sizes[-1] / mib:.0f} MiB gzip)")
    print(f"registry: docker-registry on {registry.address}, plain HTTP; "
          f"enroot: {f'{enroot} ({version})' if version else 'not found'}")
    print(f"{args.rounds} rounds (+1 warm-up), interleaved; cold = empty layer cache, "
          f"cached = the same import again with its cache; {os.cpu_count()} CPUs, "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()

    stats = {}
    for (name, mode), values in samples.items():
        walls = [w for w, _ in values]
        rss = [r for _, r in values]
        stats[(name, mode)] = {"median_s": statistics.median(walls), "min_s": min(walls),
                               "max_s": max(walls), "peak_rss_kb": max(rss),
                               "samples": [{"wall_s": w, "max_rss_kb": r} for w, r in values]}
    base_name = tools[1].name
    w = max(len(t.name) for t in groups) + 8
    header = f"{'command':<{w}}  {'median s':>8}  {'min':>6}  {'max':>6}  {'peak RSS':>9}  " \
             f"{'x baseline':>10}" + (f"  {'x enroot':>8}" if version else "")
    print(header)
    for tool in groups:
        for mode in ("cold", "cached"):
            s = stats[(tool.name, mode)]
            row = f"{tool.name + ', ' + mode:<{w}}  {s['median_s']:8.2f}  {s['min_s']:6.2f}  " \
                  f"{s['max_s']:6.2f}  {s['peak_rss_kb'] / 1024:5.1f} MiB"
            if tool is not big:
                s["x_baseline"] = s["median_s"] / stats[(base_name, mode)]["median_s"]
                row += f"  {s['x_baseline']:10.2f}"
                if version:
                    s["x_enroot"] = s["median_s"] / stats[("enroot import", mode)]["median_s"]
                    row += f"  {s['x_enroot']:8.2f}"
            print(row)
    print()
    for mode in ("cold", "cached"):
        own = stats[("sqbox import", mode)]["median_s"]
        line = f"sqbox import, {mode}: {stats[(base_name, mode)]['median_s'] / own:.2f}x " \
               f"faster than the baseline pipeline"
        if version:
            line += f", {stats[('enroot import', mode)]['median_s'] / own:.2f}x faster " \
                    f"than enroot import"
        print(line)
    small = stats[("sqbox import", "cold")]["peak_rss_kb"]
    large = stats[(big.name, "cold")]["peak_rss_kb"]
    print(f"memory: sqbox import's peak RSS {small / 1024:.1f} MiB for the "
          f"{uncompressed / mib:.0f} MiB image, {large / 1024:.1f} MiB with "
          f"{big_layer[2] / mib:.0f} MiB more ({large / small:.2f}x)")
    print("output sizes: " + ", ".join(f"{name} {size / mib:.1f} MiB"
                                        for name, size in output_sizes.items()))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"image": image, "rounds": args.rounds, "cpus": os.cpu_count(),
                       "load_before": load_before, "load_after": load_after,
                       "layers": [{"name": n, "tar_bytes": s, "gzip_bytes": c}
                                  for (n, _, s), c in zip(layers, sizes)],
                       "big_layer": {"name": big_layer[0], "tar_bytes": big_layer[2],
                                     "gzip_bytes": big_sizes[-1]},
                       "enroot": {"path": enroot, "version": version} if version else None,
                       "output_bytes": output_sizes,
                       "rows": [{"command": name, "mode": mode, **s}
                                for (name, mode), s in stats.items()]}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

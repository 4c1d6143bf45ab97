#!/usr/bin/env python3
"""The warm path: `sqbox serve` through the Python client, against native Python and a cold run.

Measures in one run:
  1. fresh sandbox per execution (`python3 -c pass`), interleaved round-robin:
       native (chroot into the extracted image), Sandbox.run through `sqbox serve --pool`, and a
       cold `sqbox run IMAGE`;  target: serve <= 1.3 x native, and faster than the cold run;
  2. Session.execute("x = 1") round trip from the Python client;  target: median < 1 ms;
  3. throughput with 2 workers (the machine's cores): executions per second of `python3 -c pass`
     through one Sandbox, and the same count of native runs.

Usage: bench/serve.py [--image PATH] [--rounds N] [--execs N] [--throughput N] [--pool N]
                      [--as-user USER] [--json FILE]
"""

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import sqbox  # noqa: E402  (the client package, from the checkout)
from cold_start import default_image, summarize  # noqa: E402  (this directory's)

PAYLOAD = ["python3", "-c", "pass"]
WARMUP = 5


def die(message):
    sys.exit(f"serve bench: {message}")


def native_argv(rootfs):
    if os.geteuid() == 0:
        return ["chroot", rootfs] + PAYLOAD
    # chroot needs CAP_SYS_CHROOT: take it in a user namespace of our own.
    return ["unshare", "-r", "chroot", rootfs] + PAYLOAD


def timed_subprocess(argv):
    started = time.perf_counter()
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    elapsed = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        die(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def timed_serve(box):
    started = time.perf_counter()
    result = box.run(PAYLOAD)
    elapsed = (time.perf_counter() - started) * 1000
    if result.exit_code != 0:
        die(f"serve run failed: {result}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image")
    parser.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--execs", type=int, default=500)
    parser.add_argument("--throughput", type=int, default=200,
                        help="runs for the throughput figure (0: none)")
    parser.add_argument("--pool", type=int, default=2)
    parser.add_argument("--as-user", help="run the whole benchmark as this user (needs root)")
    parser.add_argument("--json")
    args = parser.parse_args()
    image = os.path.abspath(args.image or default_image())
    sqbox_bin = os.path.abspath(args.sqbox)
    if args.as_user:
        argv = [sys.executable, os.path.abspath(__file__), "--image", image, "--sqbox", sqbox_bin,
                "--rounds", str(args.rounds), "--execs", str(args.execs),
                "--throughput", str(args.throughput), "--pool", str(args.pool)]
        if args.json:
            argv += ["--json", os.path.abspath(args.json)]
        os.execvp("runuser", ["runuser", "-u", args.as_user, "--", "env", "-C", "/tmp", *argv])
    if not shutil.which("unsquashfs"):
        die("unsquashfs not found (scripts/install-deps installs it)")

    with tempfile.TemporaryDirectory(prefix="sqbox-serve-bench-") as workdir:
        rootfs = os.path.join(workdir, "rootfs")
        subprocess.run(["unsquashfs", "-q", "-n", "-d", rootfs, image], check=True,
                       stdout=subprocess.DEVNULL)
        native = native_argv(rootfs)
        cold = [sqbox_bin, "run", image, "--"] + PAYLOAD
        with sqbox.Sandbox(image, binary=sqbox_bin, pool=args.pool) as box:
            rows = {"native": lambda: timed_subprocess(native),
                    "serve": lambda: timed_serve(box),
                    "cold": lambda: timed_subprocess(cold)}
            samples = {name: [] for name in rows}
            names = list(rows)
            for round_index in range(WARMUP + args.rounds):
                for i in range(len(names)):
                    name = names[(round_index + i) % len(names)]
                    elapsed = rows[name]()
                    if round_index >= WARMUP:
                        samples[name].append(elapsed)
                    # Let the pool refill between rows, as it would between a harness's steps
                    # (the server refills once no run is under way: about 40 ms of CPU here),
                    # so that the refill lands in no row's sample.
                    time.sleep(0.15)

            with box.session() as session:
                for _ in range(20):
                    session.execute("x = 1")
                execs = []
                for _ in range(args.execs):
                    started = time.perf_counter()
                    result = session.execute("x = 1")
                    execs.append((time.perf_counter() - started) * 1000)
                    if result.error is not None:
                        die(f"execute failed: {result.error}")

            workers = 2
            started = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                for elapsed in pool.map(lambda _: timed_serve(box), range(args.throughput)):
                    pass
            serve_seconds = time.perf_counter() - started
        started = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda _: timed_subprocess(native), range(args.throughput)))
        native_seconds = time.perf_counter() - started

    figures = {name: summarize(values) for name, values in samples.items()}
    figures["exec_round_trip_ms"] = summarize(execs)
    if args.throughput > 0:
        figures["throughput"] = {"runs": args.throughput, "workers": workers,
                                 "serve_per_second": args.throughput / serve_seconds,
                                 "native_per_second": args.throughput / native_seconds}
    native_median = figures["native"]["median"]
    print(f"image {image}, as {pwd.getpwuid(os.geteuid()).pw_name}, {args.rounds} rounds, "
          f"serve --pool {args.pool}")
    print(f"{'fresh sandbox, python3 -c pass':34s} {'median':>8s} {'p10':>8s} {'p90':>8s} {'x native':>9s}")
    for name, label in (("native", "native (chroot)"), ("serve", "Sandbox.run via sqbox serve"),
                        ("cold", "cold sqbox run IMAGE")):
        f = figures[name]
        print(f"  {label:32s} {f['median']:8.1f} {f['p10']:8.1f} {f['p90']:8.1f} "
              f"{f['median'] / native_median:9.2f}")
    e = figures["exec_round_trip_ms"]
    print(f"Session.execute('x = 1') round trip: median {e['median']:.3f} ms "
          f"(p10 {e['p10']:.3f}, p90 {e['p90']:.3f}), {args.execs} calls")
    if "throughput" in figures:
        t = figures["throughput"]
        print(f"throughput, {args.throughput} runs of python3 -c pass with {workers} workers: "
              f"serve {t['serve_per_second']:.1f}/s, native {t['native_per_second']:.1f}/s "
              f"({t['serve_per_second'] / t['native_per_second']:.2f} x native)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()

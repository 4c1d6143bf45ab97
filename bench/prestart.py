#!/usr/bin/env python3
"""Pre-started interpreters (`sqbox serve --prestart N --preload ...`, Sandbox.run_python)
against native Python, in one run.

Measures:
  1. latency from the request to the user's code running, in a sandbox nothing else ran in,
     interleaved round-robin with native `python3 -c` (chroot into the extracted image):
       - plain: `run_python(code)` vs native `python3 -c code`,
       - with a preload (`import json, decimal, asyncio, email`): the server preloads them and
         the code imports them (no-ops), native imports them;
     the code's first act is to read CLOCK_REALTIME, compared with the host's clock just before
     the request (or the native process's spawn); also the whole round trip of each;
     target: request -> code running < 0.5 x native `python3 -c pass`'s;
  2. throughput with 2 workers: `run_python("pass")` executions per second, each in a new
     sandbox, against native `python3 -c pass` runs per second; target: >= 2 x native;
  3. resident memory of an idle pre-started sandbox (init + interpreter, PSS and RSS, with the
     preload), and what a 24 GiB node holds at that size.

Usage: bench/prestart.py [--image PATH] [--rounds N] [--throughput N] [--prestart N]
                         [--idle N] [--as-user USER] [--json FILE]
"""

import argparse
import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import sqbox  # noqa: E402  (the client package, from the checkout)
from cold_start import default_image, read_children, summarize  # noqa: E402  (this directory's)

WARMUP = 5
PRELOAD = ["json", "decimal", "asyncio", "email"]
STAMP = "import time; print(time.time_ns())"
PRELOAD_STAMP = f"import {', '.join(PRELOAD)}; " + STAMP
NODE_BYTES = 24 * 1024 ** 3


def die(message):
    sys.exit(f"prestart bench: {message}")


def native_prefix(rootfs):
    if os.geteuid() == 0:
        return ["chroot", rootfs]
    # chroot needs CAP_SYS_CHROOT: take it in a user namespace of our own.
    return ["unshare", "-r", "chroot", rootfs]


def native_sample(prefix, code):
    """(ms until the code ran, ms of the whole run)."""
    sent = time.time_ns()
    started = time.perf_counter()
    result = subprocess.run(prefix + ["python3", "-c", code], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    total = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        die(f"native python3 failed: {result.stderr.strip()}")
    return (int(result.stdout) - sent) / 1e6, total


def prestarted_sample(box, code):
    sent = time.time_ns()
    started = time.perf_counter()
    result = box.run_python(code)
    total = (time.perf_counter() - started) * 1000
    if result.exit_code != 0 or not result.prestarted:
        die(f"run_python was not served by a pre-started interpreter: {result}")
    return (int(result.stdout) - sent) / 1e6, total


def latency(box, prefix, code, rounds):
    rows = {"native": lambda: native_sample(prefix, code),
            "prestarted": lambda: prestarted_sample(box, code)}
    samples = {name: ([], []) for name in rows}
    names = list(rows)
    for round_index in range(WARMUP + rounds):
        for i in range(len(names)):
            name = names[(round_index + i) % len(names)]
            to_code, total = rows[name]()
            if round_index >= WARMUP:
                samples[name][0].append(to_code)
                samples[name][1].append(total)
            # The pool refills between requests, as it would between a harness's steps.
            time.sleep(0.05)
    return {name: {"to_code_ms": summarize(a), "round_trip_ms": summarize(b)}
            for name, (a, b) in samples.items()}


def throughput(runs, workers, call):
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: call(), range(runs)))
    return runs / (time.perf_counter() - started)


def children_cpu_ms():
    """CPU time (user + system) of every descendant waited for so far: a server's sandboxes count
    once the server has exited (each level reaps the one below)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def cpu_per_execution(runs, start, call, stop=lambda: None):
    """CPU of all processes per execution, run one after another (machine load aside)."""
    before = children_cpu_ms()
    start()
    for _ in range(runs):
        call()
    stop()
    return (children_cpu_ms() - before) / runs


def descendants(pid):
    out = []
    for child in read_children(pid):
        out.append(child)
        out += descendants(child)
    return out


def memory_kib(pid):
    """(PSS, RSS) of one process, KiB. A process we may not inspect (sqbox's init is not
    dumpable, so only root reads its smaps) counts its whole RSS, from its status, as PSS."""
    fields = {}
    try:
        rollup = open(f"/proc/{pid}/smaps_rollup")
    except PermissionError:
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
        return rss, rss
    with rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields.get("Pss", 0), fields.get("Rss", 0)


def idle_memory(box, count):
    """Per idle pre-started sandbox: its init and interpreter (the interpreters are the
    processes whose argv holds the stub), PSS and RSS in KiB, averaged over `count`."""
    deadline = time.monotonic() + 120
    while True:
        payloads = []
        for pid in descendants(box.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"sqbox-prestart-ready" in f.read():
                        payloads.append(pid)
            except OSError:
                pass
        if len(payloads) >= count:
            break
        if time.monotonic() > deadline:
            die(f"only {len(payloads)} of {count} pre-started interpreters came up")
        time.sleep(0.5)
    time.sleep(3)  # every interpreter has imported and is waiting
    totals = {"pss": 0, "rss": 0, "interpreter_pss": 0, "init_pss": 0}
    for pid in payloads:
        with open(f"/proc/{pid}/stat") as f:
            init = int(f.read().rsplit(")", 1)[1].split()[1])
        pss, rss = memory_kib(pid)
        init_pss, init_rss = memory_kib(init)
        totals["pss"] += pss + init_pss
        totals["rss"] += rss + init_rss
        totals["interpreter_pss"] += pss
        totals["init_pss"] += init_pss
    return {name: value / len(payloads) for name, value in totals.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image")
    parser.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--throughput", type=int, default=200)
    parser.add_argument("--prestart", type=int, default=2)
    parser.add_argument("--idle", type=int, default=16,
                        help="pre-started sandboxes kept idle for the memory figure")
    parser.add_argument("--as-user", help="run the whole benchmark as this user (needs root)")
    parser.add_argument("--json")
    args = parser.parse_args()
    image = os.path.abspath(args.image or default_image())
    sqbox_bin = os.path.abspath(args.sqbox)
    if args.as_user:
        argv = [sys.executable, os.path.abspath(__file__), "--image", image, "--sqbox", sqbox_bin,
                "--rounds", str(args.rounds), "--throughput", str(args.throughput),
                "--prestart", str(args.prestart), "--idle", str(args.idle)]
        if args.json:
            argv += ["--json", os.path.abspath(args.json)]
        os.execvp("runuser", ["runuser", "-u", args.as_user, "--", "env", "-C", "/tmp", *argv])
    if not shutil.which("unsquashfs"):
        die("unsquashfs not found (scripts/install-deps installs it)")

    workers = 2
    figures = {}
    with tempfile.TemporaryDirectory(prefix="sqbox-prestart-bench-") as workdir:
        rootfs = os.path.join(workdir, "rootfs")
        subprocess.run(["unsquashfs", "-q", "-n", "-d", rootfs, image], check=True,
                       stdout=subprocess.DEVNULL)
        prefix = native_prefix(rootfs)
        with sqbox.Sandbox(image, binary=sqbox_bin, prestart=args.prestart) as box:
            figures["plain"] = latency(box, prefix, STAMP, args.rounds)
            run_pass = lambda: box.run_python("pass")  # noqa: E731
            figures["throughput"] = {"runs": args.throughput, "workers": workers,
                                     "prestarted_per_second":
                                         throughput(args.throughput, workers, run_pass)}
        with sqbox.Sandbox(image, binary=sqbox_bin, prestart=args.prestart,
                           preload=PRELOAD) as box:
            figures["preload"] = latency(box, prefix, PRELOAD_STAMP, args.rounds)
        native_pass_run = lambda: subprocess.run(  # noqa: E731
            prefix + ["python3", "-c", "pass"], stdin=subprocess.DEVNULL, check=True)
        figures["throughput"]["native_per_second"] = throughput(args.throughput, workers,
                                                                native_pass_run)
        # Where the throughput goes: CPU per execution, the server's start and its pool's spare
        # sandboxes spread over the runs.
        boxes = []
        figures["cpu_ms_per_execution"] = {
            "native": cpu_per_execution(args.throughput, lambda: None, native_pass_run),
            "prestarted": cpu_per_execution(
                args.throughput,
                lambda: boxes.append(sqbox.Sandbox(image, binary=sqbox_bin,
                                                   prestart=args.prestart)),
                lambda: boxes[-1].run_python("pass"), lambda: boxes[-1].close())}
        with sqbox.Sandbox(image, binary=sqbox_bin, prestart=args.idle,
                           preload=PRELOAD) as box:
            figures["idle_kib"] = idle_memory(box, args.idle)

    print(f"image {image}, as {pwd.getpwuid(os.geteuid()).pw_name}, {args.rounds} rounds, "
          f"serve --prestart {args.prestart}")
    for key, label in (("plain", "python3 -c (stamp)"),
                       ("preload", f"import {', '.join(PRELOAD)}")):
        f = figures[key]
        native_code = f["native"]["to_code_ms"]["median"]
        print(f"{label}: {'median':>8s} {'p10':>8s} {'p90':>8s} {'x native':>9s}")
        for name in ("native", "prestarted"):
            for what in ("to_code_ms", "round_trip_ms"):
                s = f[name][what]
                ratio = s["median"] / f["native"][what]["median"]
                print(f"  {name + ' ' + what:32s} {s['median']:8.2f} {s['p10']:8.2f} "
                      f"{s['p90']:8.2f} {ratio:9.2f}")
        print(f"  request -> code running: {f['prestarted']['to_code_ms']['median'] / native_code:.3f}"
              f" x native's start to code")
    t = figures["throughput"]
    print(f"throughput, {t['runs']} executions with {workers} workers: run_python "
          f"{t['prestarted_per_second']:.1f}/s, native python3 -c pass "
          f"{t['native_per_second']:.1f}/s "
          f"({t['prestarted_per_second'] / t['native_per_second']:.2f} x native)")
    c = figures["cpu_ms_per_execution"]
    print(f"CPU per execution (all processes): run_python('pass') {c['prestarted']:.1f} ms, "
          f"native python3 -c pass {c['native']:.1f} ms "
          f"({c['prestarted'] / c['native']:.2f} x native)")
    m = figures["idle_kib"]
    per_node = NODE_BYTES / (m["pss"] * 1024)
    figures["idle_kib"]["per_24_gib_node_by_pss"] = per_node
    print(f"idle pre-started sandbox (preload {', '.join(PRELOAD)}), {args.idle} idle: "
          f"PSS {m['pss'] / 1024:.1f} MiB (interpreter {m['interpreter_pss'] / 1024:.1f}, "
          f"init {m['init_pss'] / 1024:.1f}), RSS {m['rss'] / 1024:.1f} MiB; "
          f"a 24 GiB node holds ~{per_node:.0f} by PSS")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()

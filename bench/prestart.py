#!/usr/bin/env python3
"""Pre-started interpreters (`sqbox serve --prestart N --preload ...`) and the zygote
(`sqbox serve --zygote --preload ...`), through Sandbox.run_python, against native Python, in
one run.

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
Each of 1 and 2 (and the CPU per execution) for both ways: pre-started sandboxes, and
sandboxes forked from the zygote (refused as root: skipped there, saying so). Native is measured
in the same rounds as each.

Usage: bench/prestart.py [--image PATH] [--rounds N] [--throughput N] [--prestart N]
                         [--idle N] [--as-user USER] [--json FILE]
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


# How run_python is served: the client's Sandbox options for each way.
WAYS = {"prestarted": lambda args: {"prestart": args.prestart},
        "zygote": lambda args: {"zygote": True}}


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
            "sqbox": lambda: prestarted_sample(box, code)}
    samples = {name: ([], []) for name in rows}
    names = list(rows)
    for round_index in range(WARMUP + rounds):
        for i in range(len(names)):
            name = names[(round_index + i) % len(names)]
            to_code, total = rows[name]()
            if round_index >= WARMUP:
                samples[name][0].append(to_code)
                samples[name][1].append(total)
            # The pool refills between requests, as it would between a harness's steps (the
            # server refills once no run is under way), so that the refill lands in no row's
            # sample.
            time.sleep(0.25)
    return {name: {"to_code_ms": summarize(a), "round_trip_ms": summarize(b)}
            for name, (a, b) in samples.items()}


def throughput(runs, workers, call):
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: call(), range(runs)))
    return runs / (time.perf_counter() - started)


def machine_cpu_ms():
    """CPU time the whole machine has spent busy (user, nice, system, irq, softirq; all CPUs):
    every process of a run and the kernel's own threads (a network namespace's teardown runs in
    one), which no process's rusage holds; the zygote's requests are reaped by processes that
    are killed at the server's end, so their rusage never reaches this one. Run on an otherwise
    idle machine."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    return busy * 1000 / os.sysconf("SC_CLK_TCK")


def cpu_per_execution(runs, start, call, stop=lambda: None):
    """CPU of the machine per execution, run one after another."""
    before = machine_cpu_ms()
    start()
    for _ in range(runs):
        call()
    stop()
    return (machine_cpu_ms() - before) / runs


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


def measure_way(image, sqbox_bin, options, args, prefix, native_pass_run, workers):
    """Latency (plain, with the preload), throughput and CPU per execution of run_python served
    with the Sandbox `options`, each next to native measured in the same rounds."""
    figures = {}
    # The zygote always has the preload imported; with nothing to preload it imports nothing.
    with sqbox.Sandbox(image, binary=sqbox_bin, **options) as box:
        figures["plain"] = latency(box, prefix, STAMP, args.rounds)
        figures["throughput"] = {
            "runs": args.throughput, "workers": workers,
            "sqbox_per_second": throughput(args.throughput, workers,
                                           lambda: box.run_python("pass")),
            "native_per_second": throughput(args.throughput, workers, native_pass_run)}
    with sqbox.Sandbox(image, binary=sqbox_bin, preload=PRELOAD, **options) as box:
        figures["preload"] = latency(box, prefix, PRELOAD_STAMP, args.rounds)
    # Where the throughput goes: CPU per execution, the server's start (and its pool's spare
    # sandboxes) spread over the runs.
    boxes = []
    figures["cpu_ms_per_execution"] = {
        "native": cpu_per_execution(args.throughput, lambda: None, native_pass_run),
        "sqbox": cpu_per_execution(
            args.throughput,
            lambda: boxes.append(sqbox.Sandbox(image, binary=sqbox_bin, **options)),
            lambda: boxes[-1].run_python("pass"), lambda: boxes[-1].close())}
    return figures


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
        native_pass_run = lambda: subprocess.run(  # noqa: E731
            prefix + ["python3", "-c", "pass"], stdin=subprocess.DEVNULL, check=True)
        for way, options in WAYS.items():
            if way == "zygote" and os.geteuid() == 0:
                print("zygote: skipped: sqbox serve refuses --zygote as root (mapping uid 0 "
                      "into a request's user namespace needs CAP_SETFCAP); use --as-user",
                      file=sys.stderr)
                continue
            figures[way] = measure_way(image, sqbox_bin, options(args), args, prefix,
                                       native_pass_run, workers)
        with sqbox.Sandbox(image, binary=sqbox_bin, prestart=args.idle,
                           preload=PRELOAD) as box:
            figures["idle_kib"] = idle_memory(box, args.idle)

    print(f"image {image}, as {pwd.getpwuid(os.geteuid()).pw_name}, {args.rounds} rounds, "
          f"serve --prestart {args.prestart} / --zygote")
    for way in WAYS:
        if way not in figures:
            continue
        for key, label in (("plain", "python3 -c (stamp)"),
                           ("preload", f"import {', '.join(PRELOAD)}")):
            f = figures[way][key]
            native_code = f["native"]["to_code_ms"]["median"]
            print(f"{way}, {label}: {'median':>8s} {'p10':>8s} {'p90':>8s} {'x native':>9s}")
            for name in ("native", "sqbox"):
                for what in ("to_code_ms", "round_trip_ms"):
                    st = f[name][what]
                    ratio = st["median"] / f["native"][what]["median"]
                    print(f"  {name + ' ' + what:32s} {st['median']:8.2f} {st['p10']:8.2f} "
                          f"{st['p90']:8.2f} {ratio:9.2f}")
            print(f"  request -> code running: {f['sqbox']['to_code_ms']['median'] / native_code:.3f}"
                  f" x native's start to code")
        t = figures[way]["throughput"]
        print(f"{way}: throughput, {t['runs']} executions with {workers} workers: run_python "
              f"{t['sqbox_per_second']:.1f}/s, native python3 -c pass "
              f"{t['native_per_second']:.1f}/s "
              f"({t['sqbox_per_second'] / t['native_per_second']:.2f} x native)")
        c = figures[way]["cpu_ms_per_execution"]
        print(f"{way}: CPU per execution (the machine's): run_python('pass') {c['sqbox']:.1f} ms, "
              f"native python3 -c pass {c['native']:.1f} ms "
              f"({c['sqbox'] / c['native']:.2f} x native)")
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

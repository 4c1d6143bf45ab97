#!/usr/bin/env python3
"""Where a cold start goes: the FUSE requests and the CPU time of single `sqbox run`s.

For each image (and the extracted directory, as the floor without FUSE) runs
`sqbox run --image-server-idle 0 IMAGE -- python3 -c pass` (a FUSE mount and
server of the run's own, as a first run has: the tracing follows the run's own connection) ROUNDS
times, interleaved, each under
`perf record` of the kernel's fuse:fuse_request_send / fuse_request_end tracepoints and
the exec and exit of every process (system-wide, so another FUSE user on the host adds
requests: read the medians), then ROUNDS more times under `perf record` sampling the CPU
of sqbox's processes and the payload (inherited to children only). Prints per image the
median of: wall time from sqbox's exec to the last exit, when FUSE_INIT was sent, when the
payload was exec'd, requests by kind, requests the payload itself waited for and how long,
bytes of READ replies, and the CPU time of sqbox's processes, of decompression and of the
payload.

Needs root (perf, the tracepoints) and perf. By default uses the images cold_start.py made
(build/bench-images/KEY/*.sqsh: run cold_start.py once first), whose *.first.sqsh copies are
evicted from the page cache before each traced run, as cold_start.py's first-run rows are.

Usage: bench/fuse_requests.py [--rounds N] [--first-run] [--json FILE] [IMAGE_OR_DIR ...]
"""

import argparse
import collections
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from cold_start import REPO, PAYLOAD, evict, extract

SEND = re.compile(r"connection (\d+) req (\d+) opcode \d+ \((\w+)\)")
END = re.compile(r"connection (\d+) req (\d+) len (\d+) error (-?\d+)")
FORK = re.compile(r"pid=(\d+) child_comm=.* child_pid=(\d+)")
LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
# Symbols of the decompressors linked into sqbox (zlib, zstd, lzo, lz4, xz).
DECOMPRESSION = re.compile(r"inflate|adler32|crc32|ZSTD_|HUF_|FSE_|lzo|LZ4|lzma|xz_")
SAMPLE_HZ = 9999
# cold_start.py's copies of its images for first runs: evicted before each traced run here too.
FIRST_RUN_SUFFIX = ".first.sqsh"


def die(message):
    sys.exit(f"fuse_requests: {message}")


def perf_script(data, fields):
    out = subprocess.run(["perf", "script", "-i", data, "-F", fields], capture_output=True,
                         text=True, check=True).stdout
    os.unlink(data)
    return out


def traced_run(argv, env, workdir):
    data = os.path.join(workdir, "trace.data")
    subprocess.run(["perf", "record", "-q", "-a", "-o", data,
                    "-e", "fuse:fuse_request_send", "-e", "fuse:fuse_request_end",
                    "-e", "sched:sched_process_exec", "-e", "sched:sched_process_exit",
                    "-e", "sched:sched_process_fork", "--"]
                   + argv, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    # Only this run's processes and its own FUSE connection count: the trace is system-wide.
    sent, requests, execs, exits, ours, connections = {}, [], [], [], set(), set()
    for line in perf_script(data, "comm,pid,time,event,trace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, at, event, rest = m.groups()
        at = float(at) * 1000.0
        if event == "sched:sched_process_exec" and (pid in ours or (not ours and "sqbox" in rest)):
            ours.add(pid)
            execs.append((at, rest))
        elif event == "sched:sched_process_fork":
            f = FORK.search(rest)
            if f and f.group(1) in ours:
                ours.add(f.group(2))
        elif event == "sched:sched_process_exit" and pid in ours:
            exits.append(at)
        elif event == "fuse:fuse_request_send":
            s = SEND.search(rest)
            if s.group(3) == "FUSE_INIT" and pid in ours:
                connections.add(s.group(1))
            if s.group(1) in connections:
                sent[s.group(1, 2)] = (at, comm, s.group(3))
        elif event == "fuse:fuse_request_end":
            e = END.search(rest)
            if e.group(1, 2) in sent:
                t0, who, kind = sent.pop(e.group(1, 2))
                requests.append({"at": t0, "waited": at - t0, "comm": who, "kind": kind,
                                 "reply": int(e.group(3))})
    start = execs[0][0]
    payload = next((at for at, rest in execs if PAYLOAD[0] in rest), None)
    init = next((r["at"] for r in requests if r["kind"] == "FUSE_INIT"), None)
    mine = [r for r in requests if r["comm"] == PAYLOAD[0]]
    return {
        "wall_ms": max(exits) - start,
        "fuse_init_at_ms": init - start if init is not None else None,
        "payload_exec_at_ms": payload - start,
        "requests": len(requests),
        "kinds": dict(collections.Counter(r["kind"] for r in requests)),
        "payload_requests": len(mine),
        "payload_waited_ms": sum(r["waited"] for r in mine),
        "read_reply_bytes": sum(max(0, r["reply"] - 16) for r in requests
                                if r["kind"] == "FUSE_READ"),
    }


def sampled_runs(argv, env, rounds, workdir):
    """CPU ms per run: sqbox's processes, their decompression, the payload."""
    data = os.path.join(workdir, "cpu.data")
    loop = ["sh", "-c", f'i=0; while [ $i -lt {rounds} ]; do "$@" >/dev/null; i=$((i+1)); done',
            "sh"] + argv
    subprocess.run(["perf", "record", "-q", "-F", str(SAMPLE_HZ), "-o", data, "--"] + loop,
                   env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    per_comm, decompressing = collections.Counter(), 0
    for line in perf_script(data, "comm,ip,sym").splitlines():
        parts = line.split(None, 1)
        if not parts:
            continue
        comm, sym = parts[0], parts[1] if len(parts) > 1 else ""  # sym follows the address
        per_comm[comm] += 1
        if comm == "sqbox" and DECOMPRESSION.search(sym):
            decompressing += 1
    ms = 1000.0 / SAMPLE_HZ / rounds
    return {"sqbox_cpu_ms": per_comm["sqbox"] * ms,
            "decompression_cpu_ms": decompressing * ms,
            "payload_cpu_ms": per_comm[PAYLOAD[0]] * ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help="images or directories (default: the extracted "
                    "root filesystem and the images cold_start.py made)")
    ap.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--first-run", action="store_true",
                    help="evict every image from the page cache before each traced run (those "
                         f"named *{FIRST_RUN_SUFFIX} always are)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("perf"):
        die("needs root and perf (linux-perf)")
    sqbox = os.path.abspath(args.sqbox)
    workdir = tempfile.mkdtemp(prefix="sqbox-fuse-requests-")
    try:
        targets = [os.path.abspath(t) for t in args.targets]
        if not targets:
            made = sorted(glob.glob(os.path.join(os.path.dirname(sqbox), "bench-images", "*",
                                                 "*.sqsh")))
            if not made:
                die("no images under build/bench-images: run bench/cold_start.py first")
            targets = [extract(made[0], workdir, None)] + made
        cache = os.path.join(workdir, "cache")
        env = {"SQBOX_CACHE_DIR": cache}
        traces = {t: [] for t in targets}
        for _ in range(args.rounds):
            for t in targets:
                if os.path.isfile(t) and (args.first_run or t.endswith(FIRST_RUN_SUFFIX)):
                    evict(t)
                traces[t].append(traced_run([sqbox, "run", "--image-server-idle", "0", t, "--"] + PAYLOAD,
                                            env, workdir))
        results = {}
        for t in targets:
            cpu = sampled_runs([sqbox, "run", "--image-server-idle", "0", t, "--"] + PAYLOAD, env,
                               args.rounds, workdir)
            runs = traces[t]
            med = {k: statistics.median(r[k] for r in runs if r[k] is not None)
                   for k in runs[0] if k != "kinds" and any(r[k] is not None for r in runs)}
            kinds = collections.Counter()
            for r in runs:
                kinds.update(r["kinds"])
            med["kinds_mean"] = {k: v / len(runs) for k, v in kinds.most_common()}
            results[t] = {**med, **cpu, "runs": runs}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{args.rounds} traced runs per target (medians; CPU from {args.rounds} more "
          f"sampled runs){', image evicted before each traced run' if args.first_run else ''}")
    head = ("target", "wall", "INIT@", "exec@", "reqs", "payload reqs", "waited", "READ MB",
            "sqbox CPU", "decomp CPU", "payload CPU")
    print("  ".join(f"{h:>12}" for h in head))
    for t, r in results.items():
        name = os.path.basename(t) if os.path.isfile(t) else "directory"
        cells = [name, r["wall_ms"], r.get("fuse_init_at_ms"), r["payload_exec_at_ms"],
                 r["requests"], r["payload_requests"], r["payload_waited_ms"],
                 r["read_reply_bytes"] / 1e6, r["sqbox_cpu_ms"], r["decompression_cpu_ms"],
                 r["payload_cpu_ms"]]
        print("  ".join(f"{c:>12.2f}" if isinstance(c, float) else f"{str(c):>12}"
                        for c in cells))
        print("      kinds per run: " + ", ".join(f"{k[5:]} {v:.1f}"
                                                  for k, v in r["kinds_mean"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

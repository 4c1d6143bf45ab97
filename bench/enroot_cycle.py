#!/usr/bin/env python3
"""Reset + execute: the cycle a harness runs per step when it drives enroot.

Measures, interleaved in one run on the same image:
  (a) sqbox as enroot:  enroot remove -f NAME; enroot create --name NAME IMAGE;
                        enroot start --mount DIR:/work NAME python3 /work/script.py
  (b) unpacking cycle:  rm -rf ROOTFS; unsquashfs -d ROOTFS IMAGE;
                        sqbox run --mount DIR:/work ROOTFS -- python3 /work/script.py
      (what enroot's create does: it unpacks the whole image, here followed by the same
      sandboxed run over the directory)
  (c) plain run:        sqbox run --mount DIR:/work IMAGE -- python3 /work/script.py

and prints the medians and the ratios a/c (target <= 1.5) and b/a (target >= 20).

Usage: bench/enroot_cycle.py [--image PATH] [--rounds N] [--unpack-rounds N] [--as-user USER]
                             [--json FILE]
"""

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from cold_start import default_image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP_ROUNDS = 3


def die(message):
    sys.exit(f"enroot_cycle: {message}")


class Runner:
    """Runs commands with the enroot symlink first on PATH."""

    def __init__(self, workdir, sqbox):
        self.bin_dir = os.path.join(workdir, "bin")
        os.mkdir(self.bin_dir)
        os.symlink(sqbox, os.path.join(self.bin_dir, "enroot"))
        self.env = {
            "PATH": f"{self.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": workdir,
            "ENROOT_DATA_PATH": os.path.join(workdir, "data"),
            "LANG": "C",
        }

    def run(self, command, check_output=None):
        started = time.perf_counter()
        result = subprocess.run(command, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)
        elapsed = (time.perf_counter() - started) * 1000
        if check_output is not None and (result.returncode != 0 or
                                         result.stdout != check_output):
            die(f"{' '.join(command)} failed ({result.returncode}): "
                f"{result.stdout!r} {result.stderr.strip()!r}")
        return elapsed, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="squashfs image (default: images/build python)")
    parser.add_argument("--sqbox", default=os.path.join(REPO, "build", "sqbox"))
    parser.add_argument("--rounds", type=int, default=40,
                        help="measured rounds of (a) and (c) (default 40)")
    parser.add_argument("--unpack-rounds", type=int, default=5,
                        help="measured rounds of (b), spread over the run (default 5)")
    parser.add_argument("--as-user",
                        help="run the whole benchmark as this user (needs root; the timings "
                             "then include no runuser)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    image = os.path.abspath(args.image or default_image())
    if args.as_user:
        # Switch once, for the whole run: a harness runs as its user, and runuser per command
        # would add its own cost to the three-command cycle three times.
        argv = [sys.executable, os.path.abspath(__file__), "--image", image,
                "--sqbox", os.path.abspath(args.sqbox), "--rounds", str(args.rounds),
                "--unpack-rounds", str(args.unpack_rounds)]
        if args.json:
            argv += ["--json", os.path.abspath(args.json)]
        os.execvp("runuser", ["runuser", "-u", args.as_user, "--", "env", "-C", "/tmp", *argv])
    sqbox = os.path.abspath(args.sqbox)
    for tool in ("unsquashfs",):
        if not shutil.which(tool):
            die(f"{tool} not found (scripts/install-deps installs it)")
    if not os.access(sqbox, os.X_OK):
        die(f"{sqbox}: not built (cmake --build build)")

    with tempfile.TemporaryDirectory(prefix="sqbox-enroot-cycle-") as workdir:
        os.chmod(workdir, 0o755)
        runner = Runner(workdir, sqbox)
        work = os.path.join(workdir, "work")
        os.mkdir(work)
        with open(os.path.join(work, "script.py"), "w") as script:
            script.write("print('step done')\n")
        expected = "step done\n"
        payload = ["python3", "/work/script.py"]
        rootfs = os.path.join(workdir, "rootfs")

        def cycle_enroot():
            t_remove, _ = runner.run(["enroot", "remove", "-f", "step"])
            t_create, _ = runner.run(["enroot", "create", "--name", "step", image], "")
            t_start, _ = runner.run(["enroot", "start", "--mount", f"{work}:/work", "step",
                                     *payload], expected)
            return t_remove + t_create + t_start, (t_remove, t_create, t_start)

        def cycle_unpack():
            started = time.perf_counter()
            runner.run(["rm", "-rf", rootfs])
            runner.run(["unsquashfs", "-q", "-n", "-d", rootfs, image], check_output=None)
            _, result = runner.run([sqbox, "run", "--mount", f"{work}:/work", rootfs, "--",
                                    *payload], expected)
            elapsed = (time.perf_counter() - started) * 1000
            # Untimed: write the unpacked tree back to disk now, so that its writeback does not
            # land on the next rounds of (a) and (c) (it made `create`'s few metadata writes wait).
            os.sync()
            return elapsed

        def plain_run():
            elapsed, _ = runner.run([sqbox, "run", "--mount", f"{work}:/work", image, "--",
                                     *payload], expected)
            return elapsed

        for _ in range(WARMUP_ROUNDS):
            cycle_enroot()
            plain_run()
        cycle_unpack()

        enroot_totals, parts, plain, unpack = [], [], [], []
        unpack_every = max(1, args.rounds // max(1, args.unpack_rounds))
        for round_index in range(args.rounds):
            total, split = cycle_enroot()
            enroot_totals.append(total)
            parts.append(split)
            plain.append(plain_run())
            if round_index % unpack_every == 0 and len(unpack) < args.unpack_rounds:
                unpack.append(cycle_unpack())
        while len(unpack) < args.unpack_rounds:
            unpack.append(cycle_unpack())

    median = statistics.median
    figures = {
        "image": image,
        "user": pwd.getpwuid(os.geteuid()).pw_name,
        "rounds": args.rounds,
        "unpack_rounds": args.unpack_rounds,
        "enroot_cycle_ms": median(enroot_totals),
        "enroot_remove_ms": median(p[0] for p in parts),
        "enroot_create_ms": median(p[1] for p in parts),
        "enroot_start_ms": median(p[2] for p in parts),
        "unpack_cycle_ms": median(unpack),
        "plain_run_ms": median(plain),
    }
    figures["cycle_vs_plain"] = figures["enroot_cycle_ms"] / figures["plain_run_ms"]
    figures["unpack_vs_cycle"] = figures["unpack_cycle_ms"] / figures["enroot_cycle_ms"]

    print(f"image {image}, as {figures['user']}, {args.rounds} rounds "
          f"({args.unpack_rounds} of the unpacking cycle), medians:")
    print(f"  (a) sqbox as enroot: remove+create+start  {figures['enroot_cycle_ms']:9.1f} ms"
          f"   (remove {figures['enroot_remove_ms']:.1f}, create {figures['enroot_create_ms']:.1f},"
          f" start {figures['enroot_start_ms']:.1f})")
    print(f"  (b) unsquashfs + sqbox run on the dir     {figures['unpack_cycle_ms']:9.1f} ms")
    print(f"  (c) sqbox run IMAGE                       {figures['plain_run_ms']:9.1f} ms")
    print(f"  a/c = {figures['cycle_vs_plain']:.2f}x (target <= 1.5)   "
          f"b/a = {figures['unpack_vs_cycle']:.1f}x (target >= 20)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()

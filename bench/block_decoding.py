#!/usr/bin/env python3
"""Block decoding: zlib against libdeflate on the blocks of a gzip squashfs image.

mksquashfs's default compressor writes each 128 KiB block as a zlib stream (level 9). This
compresses a file's blocks that way and decodes every block with zlib's uncompress() (what
libsquashfuse calls) and with libdeflate (what sqbox's image server calls:
src/image/block_decoders.h), each into one reused block buffer as the image server decodes, best
of --repeats, in one run. Both libraries are the system's, called through ctypes.

Usage: bench/block_decoding.py [FILE ...] [--repeats N] [--json OUT]
Default FILE: the Python binary of the project's Python image, unpacked (images/build python).
"""

import argparse
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

BLOCK = 128 * 1024


def die(msg):
    sys.exit(f"block_decoding: {msg}")


def library(name, package):
    path = ctypes.util.find_library(name)
    if path is None:
        die(f"lib{name} not found (Debian: {package})")
    return ctypes.CDLL(path)


def libz():
    lib = library("z", "zlib1g")
    lib.uncompress.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong), ctypes.c_char_p,
                               ctypes.c_ulong]
    return lib


def libdeflate():
    lib = library("deflate", "libdeflate0")
    lib.libdeflate_alloc_decompressor.restype = ctypes.c_void_p
    lib.libdeflate_zlib_decompress.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                               ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_size_t)]
    return lib


def default_files(workdir):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    image = subprocess.run([os.path.join(repo, "images", "build"), "python"],
                           stdout=subprocess.PIPE, check=True, text=True).stdout.strip()
    out = os.path.join(workdir, "root")
    subprocess.run(["unsquashfs", "-q", "-n", "-d", out, image, "/usr/bin/python3.11"],
                   check=True, stdout=subprocess.DEVNULL)
    return [os.path.join(out, "usr/bin/python3.11")]


def best_of(repeats, decode, blocks):
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        for block in blocks:
            decode(block)
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    lib = libdeflate()
    z = libz()
    with tempfile.TemporaryDirectory() as workdir:
        files = args.files or default_files(workdir)
        blocks = []
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            blocks += [zlib.compress(data[i:i + BLOCK], 9) for i in range(0, len(data), BLOCK)]
    decoded = sum(len(zlib.decompress(b)) for b in blocks)
    decompressor = lib.libdeflate_alloc_decompressor()
    out = ctypes.create_string_buffer(BLOCK)
    size = ctypes.c_size_t()

    out_size = ctypes.c_ulong()

    def with_libdeflate(block):
        if lib.libdeflate_zlib_decompress(decompressor, block, len(block), out, BLOCK,
                                          ctypes.byref(size)) != 0:
            die("libdeflate refused a block zlib wrote")

    def with_zlib(block):
        out_size.value = BLOCK
        if z.uncompress(out, ctypes.byref(out_size), block, len(block)) != 0:
            die("zlib refused a block it wrote")

    with_zlib = best_of(args.repeats, with_zlib, blocks)
    with_deflate = best_of(args.repeats, with_libdeflate, blocks)
    result = {"blocks": len(blocks), "decoded_mb": decoded / 1e6,
              "zlib_ms": with_zlib * 1e3, "libdeflate_ms": with_deflate * 1e3,
              "zlib_mb_per_s": decoded / 1e6 / with_zlib,
              "libdeflate_mb_per_s": decoded / 1e6 / with_deflate,
              "speedup": with_zlib / with_deflate}
    print(f"{len(blocks)} blocks of 128 KiB, {result['decoded_mb']:.2f} MB decoded, best of "
          f"{args.repeats}:")
    print(f"  zlib        {result['zlib_ms']:7.2f} ms  {result['zlib_mb_per_s']:6.0f} MB/s")
    print(f"  libdeflate  {result['libdeflate_ms']:7.2f} ms  {result['libdeflate_mb_per_s']:6.0f} MB/s"
          f"  ({result['speedup']:.2f}x zlib's speed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

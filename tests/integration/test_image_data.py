"""Every byte a payload reads from an image is the image's.

sqbox's FUSE server answers reads, splicing stored data blocks straight from the image file, and
a second thread has the kernel read ahead the rest of each file being read
(src/image/squashfs_prefetch.h). These tests read files in orders that race that read-ahead (tail
first, pages shuffled, two readers at once, files larger than the prefetch limit) from images in
the layouts enroot and mksquashfs produce, and compare every byte with the file the image was made
from.
"""
import hashlib
import random
import subprocess

import pytest

PAGE = 4096
# Larger than one prefetch chunk (128 KiB), not a multiple of a page, and one file larger than
# the per-file prefetch limit (16 MiB).
FILES = {
    "big.bin": 5 * 1024 * 1024 + 1234,
    "huge.bin": 17 * 1024 * 1024 + 77,
    "chunk.bin": 128 * 1024,
    "small.txt": 3000,
    "empty": 0,
}
# enroot's default layout (data stored, metadata compressed), mksquashfs's defaults (gzip),
# zstd, compressed data with fragments, and everything stored without fragments.
LAYOUTS = {
    "enroot-default": ["-comp", "lzo", "-noD"],
    # mksquashfs's defaults, and zstd: blocks decoded by sqbox's decoders (image/block_decoders.h)
    "gzip": [],
    "zstd": ["-comp", "zstd"],
    "lz4": ["-comp", "lz4"],
    "xz": ["-comp", "xz"],
    "stored": ["-noI", "-noD", "-noF", "-noX", "-no-fragments"],
}


@pytest.fixture(scope="module")
def data_tree(tmp_path_factory, busybox_image):
    tree = tmp_path_factory.mktemp("data") / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-no-xattrs", "-d", str(tree), busybox_image],
                   check=True, stdout=subprocess.DEVNULL)
    generator = random.Random(20261121)
    digests = {}
    for name, size in FILES.items():
        # Random bytes with a zero run in the middle: incompressible data and data that
        # compresses to almost nothing, in one file.
        data = bytearray(generator.randbytes(size))
        if size > 3 * PAGE:
            data[PAGE:3 * PAGE] = bytes(2 * PAGE)
        (tree / "data").mkdir(exist_ok=True)
        (tree / "data" / name).write_bytes(data)
        digests[name] = (bytes(data), hashlib.sha256(data).hexdigest())
    return tree, digests


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def data_image(request, data_tree, tmp_path_factory):
    tree, digests = data_tree
    image = tmp_path_factory.mktemp("image") / f"{request.param}.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-all-root", "-noappend", "-quiet",
                    "-no-progress", *LAYOUTS[request.param]], check=True, stdout=subprocess.DEVNULL)
    return str(image), digests


def page_digests(data):
    return [hashlib.sha256(data[i:i + PAGE]).hexdigest() for i in range(0, len(data), PAGE)]


def test_whole_files_read_in_order(sqbox, data_image):
    image, digests = data_image
    result = sqbox.run(image, "sh", "-c", "cd /data && sha256sum " + " ".join(sorted(FILES)))
    assert result.returncode == 0, result.stderr
    seen = dict(reversed(line.split()) for line in result.stdout.splitlines())
    assert seen == {name: digest for name, (_, digest) in digests.items()}


def test_tail_first_then_shuffled_pages(sqbox, data_image):
    # The first read is the last page, so the prefetch starts from the end of the file while the
    # payload then asks for pages all over it, each in its own process.
    image, digests = data_image
    data, _ = digests["big.bin"]
    pages = len(page_digests(data))
    order = [pages - 1] + random.Random(7).sample(range(pages - 1), 120)
    script = "; ".join(
        f"dd if=/data/big.bin bs={PAGE} skip={page} count=1 2>/dev/null | sha256sum" for page in order)
    result = sqbox.run(image, "sh", "-c", script, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = page_digests(data)
    assert [line.split()[0] for line in result.stdout.splitlines()] == [expected[p] for p in order]


def test_two_readers_from_both_ends(sqbox, data_image):
    # One reader streams the file forwards while another walks it backwards in 64 KiB steps.
    image, digests = data_image
    data, digest = digests["huge.bin"]
    step = 64 * 1024
    blocks = (len(data) + step - 1) // step
    backwards = " ".join(str(block) for block in range(blocks - 1, -1, -1))
    script = (f"sha256sum /data/huge.bin > /tmp/forward & "
              f"for b in {backwards}; do dd if=/data/huge.bin bs={step} skip=$b count=1 "
              f"2>/dev/null; done > /tmp/backward; wait; cat /tmp/forward; "
              f"sha256sum < /tmp/backward")
    result = sqbox.run(image, "sh", "-c", script, timeout=120)
    assert result.returncode == 0, result.stderr
    forward, backward = result.stdout.splitlines()
    assert forward.split()[0] == digest
    reassembled = b"".join(data[b * step:(b + 1) * step] for b in range(blocks - 1, -1, -1))
    assert backward.split()[0] == hashlib.sha256(reassembled).hexdigest()


def test_reading_a_file_twice_in_one_sandbox(sqbox, data_image):
    # The second pass reads only from the page cache the first pass (and the prefetch) filled.
    image, digests = data_image
    _, digest = digests["huge.bin"]
    result = sqbox.run(image, "sh", "-c",
                       "tail -c 100 /data/huge.bin >/dev/null; sha256sum /data/huge.bin; "
                       "sha256sum /data/huge.bin")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == [digest, digest]

"""The process that reads an imported image's layers and writes the image, seen from outside:
while it runs it is sqbox's child with no_new_privs and a seccomp filter (it confined itself
before reading a layer); when it dies in the middle (here: SIGKILL, as a crash or the kernel's
OOM killer would end it), the import fails with one line, exit 125, and leaves nothing behind.

The layer is 64 MiB of random bytes written with xz (slow to compress on any machine), so the
reader lives long enough to be found; once found it is stopped (SIGSTOP) while it is examined.
"""
import os
import signal
import subprocess
import tarfile
import io
import time
from pathlib import Path

import pytest

from test_import import write_layout

LAYER_BYTES = 64 << 20


def slow_layout(directory: Path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("random.bin")
        info.size = LAYER_BYTES
        tar.addfile(info, io.BytesIO(os.urandom(LAYER_BYTES)))
    write_layout(directory, [buffer.getvalue()],
                 media_type="application/vnd.oci.image.layer.v1.tar")


def status_of(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]
    except FileNotFoundError:
        return []


def confined_reader(importer):
    """The import's child once its seccomp filter is on, stopped; None if the import ended first."""
    while importer.poll() is None:
        for child in children_of(importer.pid):
            try:
                if status_of(child).get("Seccomp") == "2":
                    os.kill(child, signal.SIGSTOP)
                    return child
            except (FileNotFoundError, ProcessLookupError):
                pass  # it ended meanwhile
        time.sleep(0.001)
    return None


def start_import(sqbox_bin, tmp_path):
    layout = tmp_path / "layout"
    slow_layout(layout)
    out = tmp_path / "out"
    out.mkdir()
    importer = subprocess.Popen([sqbox_bin, "import", "--compression", "xz", f"oci:{layout}",
                                 "-o", str(out / "x.sqsh")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return importer, out


def test_the_reader_is_confined_while_it_reads(sqbox_bin, tmp_path):
    importer, out = start_import(sqbox_bin, tmp_path)
    try:
        reader = confined_reader(importer)
        assert reader is not None, f"no confined reader seen: {importer.communicate()}"
        status = status_of(reader)
        os.kill(reader, signal.SIGCONT)
        assert status["NoNewPrivs"] == "1", status
        assert status["Seccomp"] == "2", status
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
        assert int(status["CapBnd"], 16) == 0 or os.geteuid() != 0, status
        # Its parent, which renames the image into place afterwards, is not filtered.
        assert status_of(importer.pid)["Seccomp"] == "0"
        stdout, stderr = importer.communicate(timeout=600)
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.communicate()
    assert importer.returncode == 0, stderr
    assert os.listdir(out) == ["x.sqsh"]


def test_a_reader_that_dies_is_one_line_and_leaves_nothing(sqbox_bin, tmp_path):
    importer, out = start_import(sqbox_bin, tmp_path)
    try:
        reader = confined_reader(importer)
        assert reader is not None, f"no confined reader seen: {importer.communicate()}"
        os.kill(reader, signal.SIGKILL)
        stdout, stderr = importer.communicate(timeout=120)
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.communicate()
    assert importer.returncode == 125, stderr
    assert stderr.strip().splitlines() == [
        "sqbox: the image's layers could not be read: the reader was ended by signal 9 "
        "(SIGKILL) (the reader crashed)"], stderr
    assert os.listdir(out) == []  # neither the image nor its temporary file

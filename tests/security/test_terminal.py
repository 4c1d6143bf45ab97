"""Injecting input into the caller's terminal (TIOCSTI), with and without seccomp, whether or not
the terminal is sqbox's controlling terminal."""
import fcntl
import os
import subprocess
import termios
import threading
import tty

import pytest

from escape_support import GRACE, PRELUDE, SANDBOX_TIMEOUT, parse_results

INJECT = r'''
import fcntl, glob, termios
def tiocsti(fd, request):
    ctypes.set_errno(0)
    ret = _libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_char_p(b"Q"))
    return ret, ctypes.get_errno()

for fd in (0, 1, 2):
    note(f"tiocsti_{fd}", tiocsti(fd, 0x5412))
    note(f"tiocsti_high_bits_{fd}", tiocsti(fd, 0x100005412))
attempt("dev_tty", os.open, "/dev/tty", os.O_RDWR)
# Take the terminal as controlling terminal first (plain, then "steal"), and inject again.
for steal in (0, 1):
    ctypes.set_errno(0)
    ret = _libc.ioctl(ctypes.c_int(0), ctypes.c_ulong(termios.TIOCSCTTY), ctypes.c_long(steal))
    RESULTS[f"tiocsctty_{steal}"] = "ok" if ret == 0 else ename(ctypes.get_errno())
    note(f"tiocsti_after_sctty_{steal}", tiocsti(0, 0x5412))
for i, path in enumerate(sorted(glob.glob("/dev/pts/[0-9]*"))):
    fd = attempt(f"open_pts_{i}", os.open, path, os.O_RDWR | os.O_NOCTTY)
    if fd is not None:
        note(f"tiocsti_pts_{i}", tiocsti(fd, 0x5412))
finish(sid=os.getsid(0) == os.getpid())
'''


def _drain(fd, sink):
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO once every slave descriptor is closed
            return
        if not data:
            return
        sink.append(data)


@pytest.mark.parametrize("controlling", [True, False], ids=["ctty", "not-ctty"])
@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_tiocsti_cannot_inject_into_the_callers_terminal(box, controlling, seccomp):
    """sqbox's stdin and stdout are a pty slave (the caller's terminal), which is sqbox's
    controlling terminal or nobody's. Every TIOCSTI fails, and nothing is queued on the
    terminal's input."""
    master, slave = os.openpty()
    tty.setraw(slave)  # no echo and no line buffering: a queued byte is readable at once

    def take_terminal():
        os.setsid()
        if controlling:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    options = ["--seccomp", "none"] if seccomp == "none" else []
    argv = box.argv(box.python_image, ["python3", "-c", PRELUDE + INJECT, box.marker], options)
    output = []
    reader = threading.Thread(target=_drain, args=(master, output))
    reader.start()
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                                preexec_fn=take_terminal)
        _, stderr = proc.communicate(timeout=SANDBOX_TIMEOUT + GRACE)
        os.set_blocking(slave, False)
        try:
            queued = os.read(slave, 4096)
        except BlockingIOError:
            queued = b""
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    res = parse_results(b"".join(output).decode(errors="replace"))
    assert res is not None, (proc.returncode, output, stderr)
    assert proc.returncode == 0, stderr
    assert queued == b"", f"injected into the caller's terminal: {queued!r}"
    # EPERM: not the caller's controlling terminal (or the profile); EIO: legacy TIOCSTI is
    # off; ENOTTY: the payload holds a pipe, not the terminal.
    refused = ("EPERM", "EIO", "ENOTTY")
    for key, value in res.items():
        if key.startswith("tiocsti"):
            assert value in refused, (key, res)
    assert res["dev_tty"] == "ENXIO", res  # no controlling terminal
    # ... and it cannot take the caller's terminal as one: it never holds that terminal (sqbox
    # relays a terminal through a pipe), or the terminal is sqbox's own controlling terminal.
    assert res["tiocsctty_0"] in ("EPERM", "ENOTTY"), res
    assert res["tiocsctty_1"] in ("EPERM", "ENOTTY"), res
    assert res["sid"] is True
    if seccomp == "none":
        assert b"seccomp" in stderr.lower()

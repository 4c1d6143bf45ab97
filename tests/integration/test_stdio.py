"""stdio: --output-limit, and the caller's terminal never reaching the payload."""
import json
import os
import select
import subprocess
import time


def test_output_limit_caps_each_stream_and_is_reported(sqbox, busybox_image, tmp_path):
    record = tmp_path / "r.json"
    result = sqbox.run(busybox_image, "sh", "-c",
                       "head -c 100000 /dev/zero | tr '\\0' o; "
                       "head -c 50000 /dev/zero | tr '\\0' e >&2; echo done >&2; exit 7",
                       options=["--output-limit", "1000", "--json", str(record)])
    assert result.returncode == 7
    assert result.stdout == "o" * 1000
    assert result.stderr == "e" * 1000 + (
        "sqbox: output truncated: stdout and stderr passed --output-limit (1000 bytes); "
        "the rest was discarded\n")
    data = json.loads(record.read_text())
    assert data["stdout_truncated"] is True
    assert data["stderr_truncated"] is True
    assert data["truncated"] is True


def test_output_under_the_limit_passes_unchanged(sqbox, busybox_image, tmp_path):
    record = tmp_path / "r.json"
    payload = bytes(range(256)) * 40
    result = sqbox.run(busybox_image, "cat", options=["--output-limit", "1M", "--json",
                                                      str(record)],
                       input=payload, text=False)
    assert result.stdout == payload
    assert json.loads(record.read_text())["truncated"] is False


def test_sqbox_messages_are_not_counted_against_the_limit(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "sh", "-c", "head -c 5000 /dev/zero >&2; sleep 30",
                       options=["--output-limit", "10", "--timeout", "1"])
    assert result.returncode == 124
    assert result.stderr == ("\0" * 10 + "sqbox: timed out after 1 s; sandbox killed\n"
                             "sqbox: output truncated: stderr passed --output-limit (10 bytes); "
                             "the rest was discarded\n")


def test_output_is_capped_at_16_mib_by_default_and_unlimited_lifts_it(sqbox, busybox_image,
                                                                       tmp_path):
    record = tmp_path / "r.json"
    twenty = "head -c 20971520 /dev/zero"
    capped = sqbox.run(busybox_image, "sh", "-c", f"{twenty}; {twenty} >&2; exit 3",
                       options=["--json", str(record)], text=False)
    assert capped.returncode == 3
    assert capped.stdout == b"\0" * (16 << 20)
    assert capped.stderr == b"\0" * (16 << 20) + (
        b"sqbox: output truncated: stdout and stderr passed --output-limit (16777216 bytes); "
        b"the rest was discarded\n")
    data = json.loads(record.read_text())
    assert data["stdout_truncated"] is True and data["stderr_truncated"] is True
    assert data["limits"]["output"] == {"value": 16 << 20, "enforced_by": "sqbox"}

    lifted = sqbox.run(busybox_image, "sh", "-c", twenty,
                       options=["--output-limit", "unlimited", "--json", str(record)], text=False)
    assert lifted.returncode == 0 and lifted.stderr == b""
    assert len(lifted.stdout) == 20 << 20
    data = json.loads(record.read_text())
    assert data["truncated"] is False
    assert data["limits"]["output"] == {"value": None, "enforced_by": "none"}


def test_a_reader_that_goes_away_ends_the_writer_as_outside(sqbox_bin, busybox_image):
    """Relayed output behaves as the caller's own pipe would: once the reader is gone the
    payload's writes fail and `yes | head -c 10` ends with SIGPIPE, not at the timeout."""
    process = subprocess.Popen([sqbox_bin, "run", "--timeout", "60", busybox_image, "--", "yes"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout.read(10) == b"y\n" * 5
    process.stdout.close()
    assert process.wait(timeout=30) == 128 + 13
    assert process.stderr.read() == b""


def test_output_to_dev_null_is_not_relayed(sqbox_bin, busybox_image):
    """Nothing holds what goes to /dev/null: the payload gets it as it is, no relay."""
    result = subprocess.run([sqbox_bin, "run", busybox_image, "--", "sh", "-c",
                             "readlink /proc/self/fd/1 >&2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=60)
    assert result.returncode == 0
    assert result.stderr.startswith("pipe:")  # stderr is captured: relayed to be capped
    result = subprocess.run([sqbox_bin, "run", busybox_image, "--", "sh", "-c",
                             "readlink /proc/self/fd/2 >&1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            timeout=60)
    assert result.stdout == "/dev/null\n"


def test_output_to_a_terminal_is_not_capped(sqbox_bin, busybox_image):
    """A terminal holds nothing for its reader: an interactive session's output never stops
    appearing, even with an explicit --output-limit."""
    master, slave = os.openpty()
    try:
        process = subprocess.Popen(
            [sqbox_bin, "run", "--output-limit", "100", busybox_image, "--", "sh", "-c",
             "head -c 5000 /dev/zero | tr '\\0' x; echo; echo end"],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        slave = -1
        output = b""
        deadline = time.monotonic() + 30
        while b"end" not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    output += os.read(master, 65536)
                except OSError:
                    break
        assert process.wait(timeout=30) == 0
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert output.count(b"x") == 5000, output[-200:]
    assert b"truncated" not in output


def test_the_callers_terminal_is_relayed_not_handed_over(sqbox_bin, busybox_image):
    master, slave = os.openpty()
    try:
        process = subprocess.Popen(
            [sqbox_bin, "run", busybox_image, "--", "sh", "-c",
             "for fd in 0 1 2; do [ -t $fd ] && echo tty$fd || echo pipe$fd; done; "
             "read line; echo got:$line"],
            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        slave = -1
        os.write(master, b"hello\n")
        output = b""
        deadline = time.monotonic() + 30
        while b"got:" not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:
                    break
        assert process.wait(timeout=30) == 0
        text = output.decode()
        assert "pipe0" in text and "pipe1" in text and "pipe2" in text
        assert "tty" not in text.replace("\r", "")
        assert "got:hello" in text
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def _run_on_a_terminal(argv, typed=b"", rows=33, columns=101, timeout=30):
    """Runs argv with a fresh pty as its stdin/stdout/stderr (the caller's terminal); returns
    (exit status, everything written to the terminal, bytes left unread in its input queue)."""
    import fcntl
    import struct
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                               start_new_session=True)
    if typed:
        os.write(master, typed)
    output = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            output += chunk
        elif process.poll() is not None:
            break
    status = process.wait(timeout=timeout)
    pending = struct.unpack("i", fcntl.ioctl(slave, termios.FIONREAD, b"\0\0\0\0"))[0]
    os.close(master)
    os.close(slave)
    return status, output.decode(errors="replace"), pending


def test_tty_gives_the_payload_a_terminal_of_its_own(sqbox_bin, busybox_image):
    status, output, _ = _run_on_a_terminal(
        [sqbox_bin, "run", "--tty", busybox_image, "--", "sh", "-c",
         "tty; stty size; [ -t 0 ] && [ -t 1 ] && echo both-ttys; read line; eval \"$line\"; "
         "exit 3"],
        typed=b"echo typed-$((6*7))\n")
    assert status == 3
    lines = output.replace("\r", "").splitlines()
    assert "/dev/pts/0" in lines  # the sandbox's own devpts, not the caller's pty
    assert "33 101" in lines      # the caller's window size was passed on
    assert "both-ttys" in lines
    assert "typed-42" in lines


def test_tty_injection_reaches_only_the_sandbox_terminal(sqbox_bin, python_image):
    """Even without seccomp, TIOCSTI works only on the payload's own terminal: what it pushes is
    read back by the payload, and nothing arrives in the caller's terminal."""
    script = ("import fcntl, termios\n"
              "for c in b'pushed\\n':\n"
              "    fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\n"
              "print('read back:', input())\n")
    status, output, pending = _run_on_a_terminal(
        [sqbox_bin, "run", "--tty", "--seccomp", "none", python_image, "--", "python3", "-c",
         script])
    assert status == 0, output
    assert "read back: pushed" in output.replace("\r", "")
    assert pending == 0


def test_tty_needs_a_terminal(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "true", options=["--tty"], input="")
    assert result.returncode == 125
    assert result.stderr == "sqbox: --tty: stdin is not a terminal\n"


def test_sigterm_is_handled_while_terminal_input_piles_up(sqbox_bin, busybox_image):
    """The payload never reads its stdin (a relayed terminal); the caller keeps typing. sqbox must
    not block on the full pipe: SIGTERM still ends the run at once."""
    import signal
    master, slave = os.openpty()
    try:
        process = subprocess.Popen([sqbox_bin, "run", busybox_image, "--", "sleep", "60"],
                                   stdin=slave, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        os.set_blocking(master, False)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                os.write(master, b"x" * 1000 + b"\n")
            except BlockingIOError:
                time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        os.close(master)
        os.close(slave)


def test_relayed_payload_holds_no_descriptor_but_stdio(sqbox_bin, busybox_image):
    """When sqbox relays stdio (--output-limit, --tty) it keeps the caller's real stderr for its
    own messages; that descriptor, and the relay's other ends, stay out of the payload."""
    result = subprocess.run([sqbox_bin, "run", "--output-limit", "1M", busybox_image, "--",
                             "ls", "/proc/self/fd"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1", "2", "3"]  # 3: ls's own listing of the directory
    status, output, _ = _run_on_a_terminal(
        [sqbox_bin, "run", "--tty", busybox_image, "--", "ls", "/proc/self/fd"])
    assert status == 0, output
    assert output.replace("\r", "").split()[-4:] == ["0", "1", "2", "3"]

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
    assert result.stderr == "e" * 1000
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
    assert result.stderr == "\0" * 10 + "sqbox: timed out after 1 s; sandbox killed\n"


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

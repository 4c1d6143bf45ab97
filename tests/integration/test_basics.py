"""sqbox run: running commands, exit statuses, stdio, environment, results."""
import json
import os
import pwd
import signal
import subprocess
import time

from host_processes import PRINT_PID_NAMESPACE, wait_until_pid_namespace_is_empty


def test_python_prints_hello(sqbox, python_image):
    result = sqbox.run(python_image, "python3", "-c", 'print("hello")')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello\n"
    assert result.stderr == ""


def test_options_after_image_without_double_dash_belong_to_the_command(sqbox_bin, busybox_image):
    result = subprocess.run([sqbox_bin, "run", busybox_image, "echo", "-n", "--timeout"],
                            stdout=subprocess.PIPE, text=True)
    assert result.returncode == 0
    assert result.stdout == "--timeout"


def test_no_warm_up_is_still_accepted_and_old_lists_are_left_alone(sqbox, busybox_image,
                                                                   tmp_path):
    """--no-warm-up has no effect since warm-up lists were removed; scripts that pass it keep
    working. A list an older sqbox left in the cache is neither used nor removed."""
    cache = tmp_path / "cache"
    old_list = cache / "warm-up" / "busybox-list"
    old_list.parent.mkdir(parents=True, mode=0o700)
    old_list.write_bytes(b"sqbox-warm-up 1\nR/etc/passwd\0")
    env = dict(os.environ, SQBOX_CACHE_DIR=str(cache))
    for options in ([], ["--no-warm-up"], ["--no-warm-up", "--image-server-idle", "0"]):
        result = sqbox.run(busybox_image, "sh", "-c", "echo ran; cat /etc/hostname",
                           options=options, env=env)
        assert (result.returncode, result.stdout, result.stderr) == (0, "ran\nsandbox\n", ""), \
            (options, result.stderr)
    assert old_list.read_bytes() == b"sqbox-warm-up 1\nR/etc/passwd\0"
    assert sorted(p.name for p in old_list.parent.iterdir()) == ["busybox-list"]


def test_exit_code_passes_through(sqbox, busybox_image):
    assert sqbox.run(busybox_image, "sh", "-c", "exit 42").returncode == 42
    assert sqbox.run(busybox_image, "sh", "-c", "exit 0").returncode == 0


def test_death_by_signal_is_128_plus_n(sqbox, busybox_image):
    assert sqbox.run(busybox_image, "sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM
    assert sqbox.run(busybox_image, "sh", "-c", "kill -KILL $$").returncode == 128 + signal.SIGKILL


def test_command_not_found_is_127_with_one_line(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "no-such-command")
    assert result.returncode == 127
    assert result.stderr == "sqbox: no-such-command: command not found\n"


def test_command_not_executable_is_126(sqbox, busybox_image):
    result = sqbox.run(busybox_image, "/etc/passwd")
    assert result.returncode == 126
    assert result.stderr.startswith("sqbox: /etc/passwd: cannot execute")
    assert result.stderr.count("\n") == 1


def test_stdio_is_binary_safe(sqbox, busybox_image):
    data = os.urandom(3 * 1024 * 1024) + b"\x00\r\n\xff"
    result = sqbox.run(busybox_image, "cat", input=data, text=False)
    assert result.returncode == 0
    assert result.stdout == data
    result = sqbox.run(busybox_image, "sh", "-c", "cat >&2", input=b"to stderr\x00", text=False)
    assert result.stderr == b"to stderr\x00"


def test_environment_is_clean(sqbox, python_image):
    env = dict(os.environ, SQBOX_TEST_SECRET="api-key-123", SQBOX_TEST_COPY="copied")
    result = sqbox.run(python_image, "python3", "-c",
                       "import os, json; print(json.dumps(dict(os.environ)))",
                       options=["--env", "EXPLICIT=yes", "--env", "SQBOX_TEST_COPY"], env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert "SQBOX_TEST_SECRET" not in seen
    assert "api-key-123" not in result.stdout
    assert seen["EXPLICIT"] == "yes"
    assert seen["SQBOX_TEST_COPY"] == "copied"
    assert seen["LANG"] == "C.UTF-8"  # from the image's /etc/environment
    assert seen["PATH"].startswith("/usr/local/sbin:")
    # The sandbox user's name (docs/run.md, "The sandbox user"), not taken from the caller's
    # environment.
    name = "root" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert seen["USER"] == seen["LOGNAME"] == name, seen
    assert set(seen) <= {"PATH", "HOME", "USER", "LOGNAME", "TERM", "LANG", "EXPLICIT",
                         "SQBOX_TEST_COPY", "PWD", "LC_CTYPE"}


def test_env_overrides_image_environment(sqbox, python_image):
    result = sqbox.run(python_image, "sh", "-c", 'echo "$LANG"', options=["--env", "LANG=C"])
    assert result.stdout == "C\n"


def test_workdir(sqbox, busybox_image):
    assert sqbox.run(busybox_image, "pwd").stdout == "/\n"
    assert sqbox.run(busybox_image, "pwd", options=["--workdir", "/etc"]).stdout == "/etc\n"
    result = sqbox.run(busybox_image, "pwd", options=["--workdir", "/nonexistent"])
    assert result.returncode == 125
    assert "--workdir /nonexistent" in result.stderr


def test_json_record(sqbox, python_image, tmp_path):
    record_path = tmp_path / "result.json"
    result = sqbox.run(python_image, "python3", "-c",
                       "x = bytearray(64 * 1024 * 1024); import sys; sys.exit(3)",
                       options=["--json", str(record_path)])
    assert result.returncode == 3
    record = json.loads(record_path.read_text())
    assert record["exit_code"] == 3
    assert record["payload_exit_code"] == 3
    assert record["signal"] is None
    assert record["timed_out"] is False
    assert record["started"] is True
    assert record["error"] is None
    assert 0 < record["wall_ms"] < 30000
    assert record["cpu_ms"] > 0
    assert record["peak_rss_bytes"] > 64 * 1024 * 1024


def test_json_record_for_a_signal_and_for_a_failure(sqbox, busybox_image, tmp_path):
    record_path = tmp_path / "r.json"
    sqbox.run(busybox_image, "sh", "-c", "kill -SEGV $$", options=["--json", str(record_path)])
    record = json.loads(record_path.read_text())
    assert record["exit_code"] == 128 + signal.SIGSEGV
    assert record["signal"] == signal.SIGSEGV
    assert record["payload_exit_code"] is None

    sqbox.run(busybox_image, "no-such-command", options=["--json", str(record_path)])
    record = json.loads(record_path.read_text())
    assert record["exit_code"] == 127
    assert record["started"] is False
    assert "command not found" in record["error"]


def test_json_record_of_a_timed_out_run_says_it_started(sqbox, busybox_image, tmp_path):
    record_path = tmp_path / "result.json"
    result = sqbox.run(busybox_image, "sleep", "30",
                       options=["--timeout", "0.5", "--json", str(record_path)])
    assert result.returncode == 124
    record = json.loads(record_path.read_text())
    assert record["timed_out"] is True and record["started"] is True


def test_signals_are_forwarded_to_the_payload(sqbox, python_image):
    script = ("import os, signal, sys, time\n"
              "def bye(sig, frame):\n"
              # os.write: a signal may land while print('ready') is still flushing, and a print
              # from the handler would then be a reentrant call (a CPython rule, not sqbox's).
              "    os.write(1, b'got %d\\n' % sig); sys.exit(7)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "signal.signal(signal.SIGINT, bye)\n"
              "print('ready', flush=True)\n"
              # Short sleeps: a signal caught just before sleep() starts is only acted upon
              # when it returns (a CPython race, not sqbox's).
              "for _ in range(1200): time.sleep(0.05)\n")
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = sqbox.popen(python_image, "python3", "-c", script, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=20)
        assert out == f"got {int(sig)}\n"
        assert proc.returncode == 7


def test_a_sigterm_as_the_sandbox_ends_leaves_the_record_and_the_status(sqbox_bin, busybox_image,
                                                                        tmp_path):
    """scancel under proctrack/linuxproc sends SIGTERM to every process of a job, then the batch
    script's trap passes one more on to each sqbox: the second may come just as the sandbox has
    ended. Until the record is written, sqbox holds such a signal as it holds it while the
    sandbox runs; nothing is left to pass it on to, so sqbox ends as the sandbox did, record and
    all. A steady stream of SIGTERMs, from the payload's start to sqbox's end, hits that moment
    in some of the runs."""
    record_path = tmp_path / "r.json"
    for attempt in range(20):
        proc = subprocess.Popen([sqbox_bin, "run", "--json", str(record_path), busybox_image,
                                 "--", "sh", "-c", "echo ready; exec sleep 1000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        while proc.poll() is None:  # reaped only here: the pid stays sqbox's until then
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        text = record_path.read_text()
        assert text, f"attempt {attempt}: no record; sqbox ended with {proc.returncode}, {err!r}"
        record = json.loads(text)
        assert record["signal"] == signal.SIGTERM and record["exit_code"] == 143, record
        assert proc.returncode == 143, (attempt, err)


def hold_and_send_sigterm():
    """For Popen's preexec_fn: SIGTERM held and already sent, so that it waits through the exec
    for sqbox's launch to find it, as one sent just after a batch system started the task would."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_before_the_sandbox_starts_stops_it_and_leaves_the_record(sqbox_bin,
                                                                           busybox_image,
                                                                           tmp_path):
    """A batch system may signal a task it has only just started. sqbox holds the forwarded
    signals from the start of its launch: one that came before the sandbox exists starts
    nothing, and sqbox ends as if it had ended the command (143), with its record."""
    record_path = tmp_path / "r.json"
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [sqbox_bin, "run", "--json", str(record_path), "--mount", f"{out}:/out", busybox_image,
         "--", "touch", "/out/ran"],
        preexec_fn=hold_and_send_sigterm, capture_output=True, text=True, timeout=60)
    said = "stopped by SIGTERM before the sandbox started: nothing ran"
    assert result.returncode == 143, result.stderr
    assert result.stderr == f"sqbox: {said}\n"
    record = json.loads(record_path.read_text())
    assert (record["exit_code"], record["started"], record["signal"], record["error"]) == (
        143, False, None, said), record
    assert list(out.iterdir()) == []


def test_orphans_die_with_the_payload(sqbox, busybox_image):
    start = time.monotonic()
    result = sqbox.run(busybox_image, "sh", "-c",
                       PRINT_PID_NAMESPACE + "sleep 1000 & sleep 1000 & echo started")
    assert result.returncode == 0
    namespace, started = result.stdout.split()
    assert started == "started"
    assert time.monotonic() - start < 20
    assert wait_until_pid_namespace_is_empty(namespace) == []


def test_directory_image(sqbox, busybox_image, tmp_path):
    rootfs = tmp_path / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(rootfs), busybox_image], check=True,
                   stdout=subprocess.DEVNULL)
    result = sqbox.run(str(rootfs), "sh", "-c", "echo from-dir > /written; cat /written; hostname")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from-dir\nsandbox\n"
    assert not (rootfs / "written").exists()

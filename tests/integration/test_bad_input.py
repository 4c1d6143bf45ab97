"""Bad input: one line on stderr, exit 125, nothing left behind."""
import os
import subprocess


def one_line_error(result):
    assert result.returncode == 125, (result.returncode, result.stderr)
    assert result.stderr.startswith("sqbox: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_missing_image(sqbox, tmp_path):
    err = one_line_error(sqbox.run(str(tmp_path / "nope.sqsh"), "true"))
    assert "No such file or directory" in err


def test_not_a_squashfs(sqbox, tmp_path):
    bogus = tmp_path / "bogus.sqsh"
    bogus.write_bytes(os.urandom(100000))
    assert "not a squashfs image" in one_line_error(sqbox.run(str(bogus), "true"))


def test_truncated_image(sqbox, busybox_image, tmp_path):
    data = open(busybox_image, "rb").read()
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated" in one_line_error(sqbox.run(str(cut), "true"))


def test_corrupt_superblock(sqbox, busybox_image, tmp_path):
    data = bytearray(open(busybox_image, "rb").read())
    data[0:4] = b"XXXX"
    bad = tmp_path / "bad.sqsh"
    bad.write_bytes(bytes(data))
    assert "not a squashfs image" in one_line_error(sqbox.run(str(bad), "true"))


def test_corrupt_tables(sqbox, busybox_image, tmp_path):
    data = bytearray(open(busybox_image, "rb").read())
    # Wreck everything after the superblock: inode and directory tables included.
    data[96:] = bytes(len(data) - 96)
    bad = tmp_path / "zeroed.sqsh"
    bad.write_bytes(bytes(data))
    err = one_line_error(sqbox.run(str(bad), "true"))
    assert "squashfs" in err


def test_fifo_as_image(sqbox, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "neither a squashfs file nor a directory" in one_line_error(sqbox.run(str(fifo), "true"))


def test_unknown_option(sqbox_bin, busybox_image):
    result = subprocess.run([sqbox_bin, "run", "--frobnicate", busybox_image, "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    one_line_error(result)
    result = subprocess.run([sqbox_bin, "explode"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    one_line_error(result)


def test_learn_warm_up_is_an_unknown_option_since_lists_were_removed(sqbox, busybox_image,
                                                                     tmp_path):
    """Learning runs are gone with warm-up lists: the option is refused like any unknown one,
    before anything is made in the cache."""
    cache = tmp_path / "cache"
    result = sqbox.run(busybox_image, "true", options=["--learn-warm-up"],
                       env=dict(os.environ, SQBOX_CACHE_DIR=str(cache)))
    assert "--learn-warm-up" in one_line_error(result)
    assert not cache.exists()


def test_bad_option_values(sqbox, busybox_image, tmp_path):
    cases = [
        (["--memory", "lots"], "--memory"),
        (["--timeout", "0"], "--timeout"),
        (["--pids", "-3"], "--pids"),
        (["--mount", f"{tmp_path}/missing:/x"], "--mount"),
        (["--mount", f"{tmp_path}:relative"], "--mount"),
        (["--mount", f"{tmp_path}:/x:bogus"], "unknown mode"),
        (["--env", "BAD-NAME=1"], "--env"),
        (["--workdir", "relative"], "--workdir"),
    ]
    for options, expected in cases:
        err = one_line_error(sqbox.run(busybox_image, "true", options=options))
        assert expected in err, (options, err)


def test_json_path_that_cannot_be_written(sqbox, busybox_image, tmp_path):
    err = one_line_error(sqbox.run(busybox_image, "sh", "-c", "echo ran",
                                   options=["--json", str(tmp_path / "no" / "dir.json")]))
    assert "--json" in err


def test_no_command(sqbox_bin, busybox_image):
    result = subprocess.run([sqbox_bin, "run", busybox_image], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert "no command" in one_line_error(result)


IDLE_EXPECTED = ("expected a whole number of seconds from 0 (the sandbox serves its image "
                 "itself) to 86400 (a day)")
BAD_IDLE_TIMES = ["-1", "lots", "1.5", "86401", "99999999999999999999"]


def test_bad_image_server_idle_times(sqbox, busybox_image, tmp_path):
    """--image-server-idle and SQBOX_IMAGE_SERVER_IDLE: 0 is valid (the sandbox serves itself),
    so the message says the range, not "positive"; nothing starts and nothing is written."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = dict(os.environ, SQBOX_CACHE_DIR=str(cache))
    env.pop("SQBOX_IMAGE_SERVER_IDLE", None)
    for bad in BAD_IDLE_TIMES:
        err = one_line_error(sqbox.run(busybox_image, "true", env=env,
                                       options=["--image-server-idle", bad]))
        assert err == f"sqbox: invalid value '{bad}' for --image-server-idle: {IDLE_EXPECTED}\n"
        err = one_line_error(sqbox.run(busybox_image, "true",
                                       env=dict(env, SQBOX_IMAGE_SERVER_IDLE=bad)))
        assert err == (f"sqbox: invalid value '{bad}' for SQBOX_IMAGE_SERVER_IDLE: "
                       f"{IDLE_EXPECTED}\n")
    assert list(cache.iterdir()) == []
    # (A day is valid too, but would leave a server for a day.)
    result = sqbox.run(busybox_image, "true", env=env, options=["--image-server-idle", "0"])
    assert result.returncode == 0, result.stderr

"""The binary the platform wheel bundles (sqbox/_bin/sqbox): where the client's lookup puts it, and
the `sqbox` command that starts it. The wheel itself, installed in a bare Debian, is
tests/package/test_package.py's."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sqbox
from sqbox import _binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundled(tmp_path, monkeypatch):
    """Where this test's package keeps its binary (nothing there yet)."""
    path = tmp_path / "package" / "_bin" / "sqbox"
    path.parent.mkdir(parents=True)
    monkeypatch.setattr(_binary, "BUNDLED_BINARY", str(path))
    return path


def test_the_bundled_binary_comes_after_explicit_choices_and_before_path(
        sqbox_bin, bundled, tmp_path, monkeypatch):
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "sqbox").symlink_to(sqbox_bin)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.delenv("SQBOX_BIN", raising=False)
    # None bundled (the client installed from the source tree): $PATH.
    assert sqbox.find_binary() == str(on_path / "sqbox")

    bundled.symlink_to(sqbox_bin)
    assert sqbox.find_binary() == str(bundled)
    explicit = tmp_path / "explicit-sqbox"
    explicit.symlink_to(sqbox_bin)
    monkeypatch.setenv("SQBOX_BIN", str(explicit))
    assert sqbox.find_binary() == str(explicit)
    assert sqbox.find_binary(on_path / "sqbox") == str(on_path / "sqbox")

    # The client runs what it found: the bundled binary, by default.
    monkeypatch.delenv("SQBOX_BIN")
    assert sqbox.find_binary() == str(bundled)
    result = subprocess.run([sqbox.find_binary(), "--version"], stdout=subprocess.PIPE,
                            text=True, check=True)
    assert result.stdout.startswith("sqbox ")


def test_a_bundled_binary_that_cannot_run_is_reported_not_passed_over(
        sqbox_bin, bundled, tmp_path, monkeypatch):
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "sqbox").symlink_to(sqbox_bin)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.delenv("SQBOX_BIN", raising=False)
    bundled.write_bytes(Path(sqbox_bin).read_bytes())
    bundled.chmod(0o644)
    with pytest.raises(sqbox.SqboxError, match="from this package is not an executable"):
        sqbox.find_binary()


def run_command(bundled_path, argv, **kwargs):
    """Runs the `sqbox` command's main() in a fresh Python (which ignores SIGPIPE, as every
    Python does), as if installed at argv[0] with its binary at BUNDLED_PATH; prints that
    Python's pid first."""
    program = textwrap.dedent(f"""
        import os, sys
        print(os.getpid(), flush=True)
        from sqbox import _binary, _command
        _binary.BUNDLED_BINARY = {str(bundled_path)!r}
        sys.argv = {list(argv)!r}
        _command.main()
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60, **kwargs)


def test_the_command_becomes_the_binary_with_its_argv_and_default_signals(bundled):
    # A shell stands in for the binary: it shows its own pid, argv and ignored signals.
    bundled.symlink_to("/bin/sh")
    script = ('echo $$; tr "\\0" "\\n" </proc/$$/cmdline; echo; '
              'sed -n "s/^SigIgn:\\t//p" /proc/$$/status; exit 7')
    result = run_command(bundled, ["/venv/bin/sqbox", "-c", script, "name", "two words"])
    assert result.returncode == 7, result.stderr
    python_pid, shell_pid, *rest = result.stdout.split("\n")
    assert shell_pid == python_pid, "the binary runs in a child, not in place of Python"
    argv, ignored = rest[:5], rest[-2]
    assert argv == ["/venv/bin/sqbox", "-c", script, "name", "two words"]
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert int(ignored, 16) & (1 << (sig - 1)) == 0, f"{sig.name} still ignored"


def test_the_command_named_enroot_speaks_enroots_command_line(sqbox_bin, bundled):
    bundled.symlink_to(sqbox_bin)
    as_sqbox = run_command(bundled, ["/venv/bin/sqbox", "--version"])
    assert as_sqbox.returncode == 0, as_sqbox.stderr
    assert as_sqbox.stdout.split("\n")[1].startswith("sqbox ")

    enroot = run_command(bundled, ["/venv/bin/sqbox", "enroot", "version"])
    linked = run_command(bundled, ["/somewhere/enroot", "version"])
    direct = subprocess.run([sqbox_bin, "enroot", "version"], stdout=subprocess.PIPE, text=True,
                            check=True).stdout
    assert "sqbox" not in direct
    for result in (enroot, linked):
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n", 1)[1] == direct


def test_the_command_without_a_bundled_binary_says_so(bundled):
    result = run_command(bundled, ["/venv/bin/sqbox", "--version"])
    assert result.returncode == 1
    assert result.stderr.strip() == ("sqbox: this installation of the sqbox package carries no "
                                     "binary (install the platform wheel, or put sqbox on $PATH)")
    bundled.write_text("not a program")
    result = run_command(bundled, ["/venv/bin/sqbox", "--version"])
    assert result.returncode == 1 and "is not an executable file" in result.stderr

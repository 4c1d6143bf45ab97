"""Directory transfers, shells and display data through the real server and a real sandbox.

The attacks come from where they would: the session's code plants symlinks and files in its
sandbox, and (owning its interpreter, SECURITY.md) replaces the driver's answers with hostile tar
streams and endless downloads; a hostile tar is uploaded as a harness might pass one on."""
import asyncio
import base64
import io
import os
import struct
import tarfile
import time
import zlib

import pytest

import sqbox

BUDGET = 48 << 20  # the servers' --tmpfs-size here


@pytest.fixture(scope="module")
def sandbox(sqbox_bin, python_image):
    with sqbox.Sandbox(python_image, binary=sqbox_bin,
                       extra_args=["--tmpfs-size", str(BUDGET)]) as box:
        yield box


def tar_bytes(*entries):
    """(name, kind, payload): kind "file" (bytes), "dir", "symlink" (payload the target)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
            else:
                info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.SYMTYPE
                info.linkname = payload or ""
                archive.addfile(info)
    return buffer.getvalue()


def host_tree(root):
    """Every path beneath root: (kind, target or contents)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = ("dir",)
            else:
                with open(path, "rb") as f:
                    found[rel] = ("file", f.read())
    return found


def hijack_download(session, answers):
    """The session's code replaces the driver's download with one answering `answers` (dicts,
    the last repeated), as code that owns its interpreter can."""
    session.execute("import gc\nfor _t in gc.get_objects():\n"
                    "    if type(_t).__name__ == 'Transfers':\n"
                    "        _answers = %r\n"
                    "        _t.op_download = lambda req, _a=_answers: "
                    "_a.pop(0) if len(_a) > 1 else _a[0]\n" % (answers,)).raise_for_error()


# ---- directories in and out ----

def test_a_directory_goes_in_and_comes_back_as_it_was(session, tmp_path):
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(5 << 20) + bytes(range(256)))  # more than a chunk
    (src / "sub" / "b.txt").write_text("b\n")
    (src / "sub" / "deeper" / "empty").write_bytes(b"")
    (src / "link").symlink_to("sub/b.txt")
    os.chmod(src / "sub" / "b.txt", 0o751)
    sent = session.upload(src, "/tmp/work")
    assert (sent.files, sent.bytes, sent.skipped) == (4, (5 << 20) + 256 + 2, ())
    assert session.execute("import os\nos.readlink('/tmp/work/link'), "
                           "open('/tmp/work/sub/b.txt').read()").value == "('sub/b.txt', 'b\\n')"
    back = session.download("/tmp/work", tmp_path / "back")
    assert (back.files, back.bytes, back.skipped) == (4, sent.bytes, ())
    assert host_tree(tmp_path / "back") == host_tree(src)
    assert os.stat(tmp_path / "back" / "sub" / "b.txt").st_mode & 0o7777 == 0o751
    # One file, by its name.
    session.upload(src / "sub" / "b.txt", "/tmp/one")
    session.download("/tmp/one/b.txt", tmp_path / "one")
    assert host_tree(tmp_path / "one") == {"b.txt": ("file", b"b\n")}


def test_a_shell_and_the_interpreter_share_the_sandbox(session):
    shell = session.shell()
    assert shell.run("mkdir -p /tmp/shared && cd /tmp/shared && echo from-shell > f").ok
    assert session.execute("open('/tmp/shared/f').read()").value == "'from-shell\\n'"
    assert shell.run("pwd").stdout == "/tmp/shared\n"
    shell.close()
    assert shell.run("pwd").stdout != "/tmp/shared\n"  # a new shell


def test_download_never_follows_a_symlink_out(sandbox, tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("HOST SECRET")
    with sandbox.session(timeout=30) as session:
        session.execute(
            "import os\nos.makedirs('/tmp/d/sub')\nopen('/tmp/d/sub/ok', 'w').write('ok')\n"
            "for name, target in [('host', %r), ('self-root', '/proc/self/root'),\n"
            "                     ('init-root', '/proc/1/root'), ('zero', '/dev/zero'),\n"
            "                     ('up', '../../../../../..'), ('etc', '/etc'),\n"
            "                     ('sub/inside', '../sub/ok')]:\n"
            "    os.symlink(target, '/tmp/d/' + name)\n"
            "os.mkfifo('/tmp/d/fifo')" % str(secret)).raise_for_error()
        dest = tmp_path / "dest"
        before = sorted(os.listdir(tmp_path))
        got = session.download("/tmp/d", dest)
        assert sorted(got.skipped) == ["etc", "fifo", "host", "init-root", "self-root", "up",
                                       "zero"]
        assert host_tree(dest) == {"sub": ("dir",), "sub/ok": ("file", b"ok"),
                                   "sub/inside": ("link", "../sub/ok")}
        assert sorted(os.listdir(tmp_path)) == sorted(before + ["dest"])
        # The host path does not exist in the sandbox; a link to it leads nowhere.
        with pytest.raises(sqbox.SqboxError, match="FileNotFoundError"):
            session.download("/tmp/d/host", tmp_path / "nothing")
        with pytest.raises(sqbox.SqboxError, match="NotSupported"):
            session.download("/tmp/d/zero", tmp_path / "nothing")
        # Through /proc/self/root the sandbox's own root is found, bounded by the budget.
        with pytest.raises(sqbox.SqboxError, match="TooLarge"):
            session.download("/tmp/d/self-root/usr", tmp_path / "usr")
        assert secret.read_text() == "HOST SECRET"
        assert all(b"HOST SECRET" not in entry[-1] for entry in host_tree(tmp_path).values()
                   if entry[0] == "file" and entry[-1] != b"HOST SECRET")


@pytest.mark.parametrize("entries, complaint", [
    ([("../escape", "file", b"x")], "refused entry '../escape'"),
    ([("/abs-escape", "file", b"x")], "an absolute path"),
    ([("d", "dir", None), ("d/../../escape", "file", b"x")], "goes up"),
    # A link pointing out is left out: the entry below it makes a directory of that name.
    ([("ln", "symlink", "OUTSIDE"), ("ln/escape", "file", b"x")], None),
    ([("up", "symlink", ".."), ("up/escape", "file", b"x")], None),
    # A link pointing inside is made, and never followed by a later entry.
    ([("sub", "dir", None), ("in", "symlink", "sub"), ("in/x", "file", b"x")], "a symlink"),
    # Nor is a link that was in the destination before.
    ([("pre/escape", "file", b"x")], "a symlink"),
])
def test_a_hostile_download_stream_cannot_write_outside_the_destination(session, tmp_path,
                                                                         entries, complaint):
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [(name, kind, str(outside) if payload == "OUTSIDE" else payload)
               for name, kind, payload in entries]
    data = base64.b64encode(tar_bytes(*entries)).decode()
    hijack_download(session, [{"ok": True, "data_b64": data, "last": True}])
    dest = tmp_path / "box" / "dest"
    dest.mkdir(parents=True)
    (dest / "pre").symlink_to(outside)
    if complaint is None:
        got = session.download("/tmp", dest)
        assert len(got.skipped) == 1
        assert host_tree(dest)[entries[1][0]] == ("file", b"x")
    else:
        with pytest.raises(sqbox.SqboxError, match=complaint):
            session.download("/tmp", dest)
    assert list(outside.iterdir()) == []
    assert sorted(os.listdir(tmp_path)) == ["box", "outside"]
    assert os.listdir(tmp_path / "box") == ["dest"]


def test_a_hostile_download_link_pointing_out_is_left_out(session, tmp_path):
    data = tar_bytes(("abs", "symlink", "/etc/passwd"), ("rel", "symlink", "../../x"),
                     ("ok", "symlink", "f"), ("f", "file", b"1"))
    hijack_download(session, [{"ok": True, "data_b64": base64.b64encode(data).decode(),
                               "last": True}])
    got = session.download("/tmp", tmp_path / "dest")
    assert sorted(got.skipped) == ["abs", "rel"]
    assert host_tree(tmp_path / "dest") == {"ok": ("link", "f"), "f": ("file", b"1")}


def test_an_endless_download_stops_at_the_budget(session, tmp_path):
    chunk = base64.b64encode(b"\0" * (4 << 20)).decode()
    hijack_download(session, [{"ok": True, "data_b64": chunk, "last": False}])
    with pytest.raises(sqbox.SqboxError, match="TooLarge: the download would pass the "
                                               "sandbox's writable budget of %d" % BUDGET):
        session.download("/tmp", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_a_huge_file_stops_the_download_at_the_budget(session, tmp_path):
    session.execute("f = open('/tmp/huge', 'wb')\nf.truncate(5 << 30)\nf.close()")
    started = time.monotonic()
    with pytest.raises(sqbox.SqboxError, match="TooLarge: huge: the download would pass"):
        session.download("/tmp", tmp_path / "dest")
    assert not (tmp_path / "dest" / "huge").exists()
    # It stopped before reading the file: well under the time 5 GiB of zeros take.
    assert time.monotonic() - started < 60


def test_an_upload_past_the_budget_is_refused(session, tmp_path):
    (tmp_path / "big").write_bytes(b"\0" * (BUDGET + 1))
    with pytest.raises(sqbox.SqboxError, match="TooLarge"):
        session.upload(tmp_path / "big", "/tmp/in")


@pytest.mark.parametrize("entries, complaint", [
    ([("../escape", "file", b"x")], "goes up"),
    ([("/tmp/escape", "file", b"x")], "absolute path"),
    ([("out", "symlink", "/tmp")], "points outside"),
    ([("out", "symlink", "../../tmp")], "points outside"),
    ([("self", "symlink", "/proc/self/root")], "points outside"),
])
def test_a_hostile_upload_stays_beneath_its_destination(sandbox, tmp_path, entries, complaint):
    shared = tmp_path / "shared"  # a host directory the session may write, by its own mount
    shared.mkdir()
    with sandbox.session(timeout=30, mounts=[(str(shared), "/tmp/shared")]) as session:
        with pytest.raises(sqbox.SqboxError, match=complaint):
            session.upload_tar(tar_bytes(*entries), "/tmp/shared/in/dest")
        value = session.execute("import os\nsorted(os.listdir('/tmp')), "
                                "sorted(os.listdir('/tmp/shared/in'))").value
        assert "escape" not in value
    assert host_tree(shared) == {"in": ("dir",), "in/dest": ("dir",)}


def test_an_upload_never_writes_through_a_symlink_planted_in_the_sandbox(sandbox, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    with sandbox.session(timeout=30, mounts=[(str(shared), "/tmp/shared")]) as session:
        session.execute("import os\nos.makedirs('/tmp/dest')\n"
                        "os.symlink('/tmp/shared', '/tmp/dest/to-host')\n"
                        "os.symlink('/proc/self/root/tmp/shared', '/tmp/dest/via-proc')\n"
                        "os.symlink('/tmp/shared/file', '/tmp/dest/file')").raise_for_error()
        for name in ("to-host/evil", "via-proc/evil"):
            with pytest.raises(sqbox.SqboxError, match="UnsafeEntry.*not followed"):
                session.upload_tar(tar_bytes((name, "file", b"evil")), "/tmp/dest")
        # A file entry replaces the planted link; the link's target is not written.
        session.upload_tar(tar_bytes(("file", "file", b"mine")), "/tmp/dest")
        assert session.execute("open('/tmp/dest/file').read(), os.path.islink('/tmp/dest/file')"
                               ).value == "('mine', False)"
    assert host_tree(shared) == {}


# ---- shells ----

def test_a_shell_keeps_state_and_reports_each_command(sandbox):
    with sandbox.shell(timeout=30) as shell:
        assert shell.run("cd /tmp && export X=41").ok
        result = shell.run("pwd; echo $((X + 1)); echo oops >&2; exit_code() { return 3; }; "
                           "exit_code")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "/tmp\n42\n", "oops\n")
        assert not result.ok and not result.timed_out
        result = shell.run("sleep 30; echo not-reached", timeout=0.5)
        assert result.timed_out and result.exit_code == 130 and result.stdout == ""
        assert shell.run("echo $X").stdout == "41\n"
        result = shell.run("exit 4")
        assert (result.exit_code, result.shell_exited) == (4, True)
        assert shell.run("echo ${X:-fresh}").stdout == "fresh\n"
        session = shell.session
    assert session.closed


def test_a_forged_shell_reply_is_a_protocol_error(session):
    session.execute("import gc\nfor _s in gc.get_objects():\n"
                    "    if type(_s).__name__ == 'Shells':\n"
                    "        _s.op_shell = lambda req: {'ok': True, 'exit_code': 'zero'}\n")
    with pytest.raises(sqbox.ProtocolError):
        session.shell().run("true")


# ---- display data ----

def png_bytes():
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"\0\xff\0\0")) + chunk(b"IEND", b""))


def test_rich_results_come_beside_the_text(session):
    image = png_bytes()
    result = session.execute(
        "class Plot:\n    def _repr_png_(self):\n        return %r\n"
        "    def _repr_html_(self):\n        return '<table><tr><td>1</td></tr></table>'\n"
        "    def __repr__(self):\n        return 'Plot()'\n"
        "print('text too')\ndisplay({'k': 1})\nPlot()" % image)
    assert result.ok and result.stdout == "text too\n" and result.value == "Plot()"
    first, plot = result.display
    assert first.text == "{'k': 1}" and first.png is None
    assert plot.png == image and plot.html.startswith("<table>") and plot.text == "Plot()"
    assert plot._repr_mimebundle_()["image/png"] == base64.b64encode(image).decode()


def test_forged_display_data_is_a_protocol_error(session):
    session.execute("import gc\nfor _d in gc.get_objects():\n"
                    "    if type(_d).__name__ == 'RichOutput':\n"
                    "        _d.take = lambda: {'display': [{'data': {'image/png': 5}}]}\n")
    result = session.execute("1")
    assert result.error.type == "ProtocolError" and result.display == ()


# ---- asyncio ----

def test_async_files_and_shells(sqbox_bin, python_image, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f").write_text("async")

    async def main():
        async with sqbox.AsyncSandbox(python_image, binary=sqbox_bin) as box:
            async with await box.session() as session:
                await session.upload(tmp_path / "in", "/tmp/a")
                shell = session.shell()
                assert (await shell.run("cat /tmp/a/f")).stdout == "async"
                await session.download("/tmp/a", tmp_path / "out")
            async with await box.shell() as shell:
                assert (await shell.run("cd /tmp; pwd")).ok
                assert (await shell.run("pwd")).stdout == "/tmp\n"

    asyncio.run(main())
    assert (tmp_path / "out" / "f").read_text() == "async"


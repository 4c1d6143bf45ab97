"""The session driver's directory transfers, shells and display data (src/session/driver.py),
without a sandbox: the driver runs as a plain subprocess, as in test_driver.py. The same requests
through the server and a real sandbox, with the attacks from inside, are in
tests/python/test_files_shells_display.py."""
import base64
import io
import os
import stat
import struct
import tarfile
import zlib

import pytest

from test_driver import Session, session  # noqa: F401  (session is a fixture)


def tar_bytes(*entries, mode="w"):
    """A tar stream of (name, kind, payload): kind "file" (payload bytes), "dir", "symlink"
    and "hardlink" (payload the target), "fifo"."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if kind == "file":
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            if kind == "dir":
                info.mode = 0o755
            info.linkname = payload or ""
            archive.addfile(info)
    return buffer.getvalue()


def upload(session, path, data, chunk=1000):
    """Sends `data` in chunks as the client does; returns the last answer."""
    offset = 0
    while True:
        piece = data[offset:offset + chunk]
        request = {"op": "upload", "offset": offset,
                   "data_b64": base64.b64encode(piece).decode(), "last": offset + chunk >= len(data)}
        if offset == 0:
            request["path"] = str(path)
        answer = session.request(request)
        if not answer["ok"] or request["last"]:
            return answer
        offset += len(piece)


def download(session, path, limit=1 << 30):
    """The whole stream, or the failing answer."""
    data, offset = b"", 0
    while True:
        request = {"op": "download", "offset": offset, "limit": limit}
        if offset == 0:
            request["path"] = str(path)
        answer = session.request(request)
        if not answer["ok"]:
            return answer
        chunk = base64.b64decode(answer["data_b64"])
        data, offset = data + chunk, offset + len(chunk)
        if answer["last"]:
            return data, answer


def members(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name: (m.type, m.size, m.linkname, archive.extractfile(m).read()
                         if m.isreg() else None) for m in archive}


def tree(root):
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir",)
        else:
            found[rel] = ("file", path.read_bytes())
    return found


# ---- upload ----

def test_upload_unpacks_a_tar_beneath_the_destination(session, tmp_path):
    data = tar_bytes(("sub", "dir", None), ("sub/a.txt", "file", b"hello" * 1000),
                     ("./b", "file", b""), ("link", "symlink", "sub/a.txt"),
                     ("sub/same", "hardlink", "sub/a.txt"))
    answer = upload(session, tmp_path / "dest", data)
    assert answer == {"event": "result", "ok": True, "files": 4, "bytes": 5000, "skipped": []}
    dest = tmp_path / "dest"
    assert tree(dest) == {"b": ("file", b""), "link": ("link", "sub/a.txt"), "sub": ("dir",),
                          "sub/a.txt": ("file", b"hello" * 1000),
                          "sub/same": ("file", b"hello" * 1000)}
    assert os.stat(dest / "sub/a.txt").st_ino == os.stat(dest / "sub/same").st_ino


def test_upload_takes_gzip_and_keeps_modes_without_setuid(session, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("run.sh")
        info.mode, info.size = 0o4755, 3
        archive.addfile(info, io.BytesIO(b"x=1"))
    assert upload(session, tmp_path, buffer.getvalue())["ok"]
    assert stat.S_IMODE(os.stat(tmp_path / "run.sh").st_mode) == 0o755


@pytest.mark.parametrize("entries, complaint", [
    ([("../escape", "file", b"x")], "goes up"),
    ([("a/../../escape", "file", b"x")], "goes up"),
    ([("/tmp/escape-abs", "file", b"x")], "absolute"),
    ([("out", "symlink", "/")], "points outside"),
    ([("out", "symlink", "../..")], "points outside"),
    ([("d", "dir", None), ("d/out", "symlink", "../../x")], "points outside"),
    ([("h", "hardlink", "../outside")], "goes up"),
    ([("h", "hardlink", "/etc/passwd")], "absolute"),
])
def test_upload_refuses_entries_that_would_leave_the_destination(session, tmp_path, entries,
                                                                  complaint):
    dest = tmp_path / "deep" / "dest"
    answer = upload(session, dest, tar_bytes(*entries))
    assert answer["ok"] is False and answer["error"]["type"] == "UnsafeEntry", answer
    assert complaint in answer["error"]["message"]
    # Entries before the refused one stay; nothing is made outside the destination.
    assert set(tree(tmp_path)) <= {"deep", "deep/dest", "deep/dest/d"}
    assert not os.path.lexists("/tmp/escape-abs")


def test_upload_never_follows_a_symlink_already_there(session, tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "planted").symlink_to(outside)
    (dest / "file").symlink_to(outside / "target")
    answer = upload(session, dest, tar_bytes(("planted/x", "file", b"through")))
    assert answer["error"]["type"] == "UnsafeEntry", answer
    # A file entry replaces a symlink in its place; the symlink's target is never written.
    answer = upload(session, dest, tar_bytes(("file", "file", b"replaced")))
    assert answer["ok"], answer
    assert list(outside.iterdir()) == []
    assert (dest / "file").read_bytes() == b"replaced" and not (dest / "file").is_symlink()


def test_upload_leaves_out_devices_and_fifos(session, tmp_path):
    answer = upload(session, tmp_path, tar_bytes(("pipe", "fifo", None), ("f", "file", b"1")))
    assert (answer["files"], answer["skipped"]) == (1, ["pipe"])
    assert tree(tmp_path) == {"f": ("file", b"1")}


def test_upload_chunks_must_follow_each_other(session, tmp_path):
    data = tar_bytes(("f", "file", b"x" * 5000))
    first = {"op": "upload", "path": str(tmp_path), "offset": 0,
             "data_b64": base64.b64encode(data[:1000]).decode()}
    assert session.request(first)["ok"]
    gap = {"op": "upload", "offset": 2000, "data_b64": base64.b64encode(data[2000:]).decode(),
           "last": True}
    assert session.request(gap)["error"]["type"] == "TransferInterrupted"
    assert session.request(dict(gap, offset=5))["error"]["type"] == "TransferInterrupted"
    # Starting again at 0 works, and the stream in between was dropped.
    assert upload(session, tmp_path, data)["ok"]
    assert (tmp_path / "f").read_bytes() == b"x" * 5000


def test_a_broken_upload_is_reported(session, tmp_path):
    answer = upload(session, tmp_path, b"this is not a tar stream" * 100)
    assert answer["ok"] is False and answer["error"]["type"] == "BadArchive", answer
    truncated = tar_bytes(("f", "file", b"y" * 5000))[:2000]
    answer = upload(session, tmp_path, truncated)
    assert answer["ok"] is False, answer
    # The session goes on.
    assert session.run("1 + 1")["value"] == "2"


# ---- download ----

def test_download_is_a_tar_of_the_contents_with_symlinks_as_links(session, tmp_path):
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a").write_bytes(b"A" * 70000)
    (root / "empty").write_bytes(b"")
    (root / "host").symlink_to("/etc")
    (root / "self-root").symlink_to("/proc/self/root")
    os.mkfifo(root / "pipe")  # opened, a FIFO without a writer would hang a reader
    data, answer = download(session, root)
    assert answer["skipped"] == ["pipe"]
    assert members(data) == {
        "empty": (tarfile.REGTYPE, 0, "", b""), "host": (tarfile.SYMTYPE, 0, "/etc", None),
        "self-root": (tarfile.SYMTYPE, 0, "/proc/self/root", None),
        "sub": (tarfile.DIRTYPE, 0, "", None),
        "sub/a": (tarfile.REGTYPE, 70000, "", b"A" * 70000)}


def test_download_of_one_file_and_of_what_is_not_there(session, tmp_path):
    (tmp_path / "one").write_bytes(b"1")
    data, _ = download(session, tmp_path / "one")
    assert members(data) == {"one": (tarfile.REGTYPE, 1, "", b"1")}
    assert download(session, tmp_path / "missing")["error"]["type"] == "FileNotFoundError"


def test_download_stops_at_the_budget_however_large_the_file_claims_to_be(session, tmp_path):
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a terabyte that costs nothing
    answer = download(session, tmp_path, limit=1 << 20)
    assert answer["ok"] is False and answer["error"]["type"] == "TooLarge", answer
    assert "sparse" in answer["error"]["message"] and str(1 << 20) in answer["error"]["message"]
    (tmp_path / "sparse").unlink()
    (tmp_path / "small").write_bytes(b"s" * 2000)
    # Within the budget, to the byte: a header, the data padded, the end of the archive.
    assert download(session, tmp_path, limit=512 + 2048 + 1024)[1]["last"]
    assert download(session, tmp_path, limit=512 + 2048 + 1023)["error"]["type"] == "TooLarge"


def test_a_file_that_grows_while_it_is_read_is_sent_at_its_size_when_opened(session, tmp_path):
    # Code in the session appends to the file while the download reads it: the stream ends.
    path = tmp_path / "growing"
    path.write_bytes(b"g" * (9 << 20))
    session.run("import threading, time\nstop = False\ndef grow():\n"
                "    with open(%r, 'ab') as f:\n        while not stop:\n"
                "            f.write(b'x' * 65536)\n            time.sleep(0.001)\n"
                "threading.Thread(target=grow, daemon=True).start()" % str(path))
    try:
        data, _ = download(session, tmp_path)
    finally:
        session.run("stop = True")
    (kind, size, _, content), = members(data).values()
    assert size >= 9 << 20 and len(content) == size and len(data) < size + 4096


def test_download_chunks_must_follow_each_other(session, tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(9 << 20))  # more than one chunk
    first = session.request({"op": "download", "path": str(tmp_path), "offset": 0})
    assert first["ok"] and not first["last"]
    answer = session.request({"op": "download", "offset": 12345})
    assert answer["error"]["type"] == "TransferInterrupted"


# ---- shells ----

def shell(session, command, **fields):
    answer = session.request(dict(op="shell", command=command, **fields))
    assert answer.pop("event") == "result" and answer["ok"], answer
    return answer


def test_a_shell_keeps_its_directory_and_variables(session, tmp_path):
    answer = shell(session, "cd %s && X=41 && f() { echo $((X + 1)); }" % tmp_path)
    assert (answer["exit_code"], answer["stdout"], answer["stderr"]) == (0, "", "")
    answer = shell(session, "pwd; f; echo err >&2; false")
    assert (answer["exit_code"], answer["stdout"], answer["stderr"]) == \
        (1, "%s\n42\n" % tmp_path, "err\n")
    assert not answer["timed_out"] and not answer["shell_exited"]
    # Quotes, "!", and a syntax error are the command's own business.
    assert shell(session, "echo 'it'\"'\"'s!'")["stdout"] == "it's!\n"
    answer = shell(session, "if then")
    assert answer["exit_code"] == 2 and "syntax error" in answer["stderr"]
    assert shell(session, "echo $X")["stdout"] == "41\n"


def test_shells_are_kept_by_name(session):
    shell(session, "Y=a", name="one")
    shell(session, "Y=b", name="two")
    assert shell(session, "echo $Y", name="one")["stdout"] == "a\n"
    assert session.request({"op": "shell_close", "name": "one"})["closed"] is True
    assert shell(session, "echo ${Y:-gone}", name="one")["stdout"] == "gone\n"
    assert shell(session, "echo $Y", name="two")["stdout"] == "b\n"


def test_a_timeout_interrupts_the_command_and_the_shell_lives_on(session):
    shell(session, "Z=kept; sleep 60 & echo background")
    for command in ("sleep 60; echo not-reached", "while :; do :; done"):
        answer = shell(session, command, timeout=0.5)
        assert answer["timed_out"] and answer["exit_code"] == 130, answer
        assert "not-reached" not in answer["stdout"] and not answer["shell_exited"]
    answer = shell(session, "echo $Z; jobs -p | wc -l")
    assert answer["stdout"] == "kept\n1\n", answer  # the background job was left alone


def test_a_command_that_ignores_the_interrupt_is_killed(session):
    answer = shell(session, "trap '' INT; sleep 60; echo after", timeout=0.5)
    assert answer["timed_out"] and not answer["shell_exited"], answer


def test_exit_ends_the_shell_and_the_next_command_starts_another(session):
    shell(session, "W=1")
    answer = shell(session, "exit 3")
    assert (answer["exit_code"], answer["shell_exited"]) == (3, True)
    assert shell(session, "echo ${W:-fresh}")["stdout"] == "fresh\n"


def test_output_is_capped_per_command(session):
    answer = shell(session, "head -c 5000 /dev/zero | tr '\\0' a", output_limit=100)
    assert answer["stdout"] == "a" * 100 and answer["stdout_truncated"]


def test_a_shell_program_of_choice(session):
    answer = shell(session, 'echo "$0"', name="posix", program=["sh", "-i"])
    assert answer["stdout"] == "sh\n"


@pytest.mark.parametrize("fields", [{"command": 5}, {"command": "a\0b"}, {"command": "x",
                                    "timeout": 0}, {"command": "x", "program": "sh"}])
def test_bad_shell_requests(session, fields):
    answer = session.request(dict(op="shell", **fields))
    assert answer["ok"] is False and answer["error"]["type"] == "BadRequest"


# ---- display data ----

def png(width=1, height=1):
    """A real PNG: signature, IHDR, IDAT, IEND."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff)
    rows = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                            0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def test_a_trailing_value_with_rich_representations_is_displayed(session):
    image = png(2, 2)
    answer = session.run("class Chart:\n    def _repr_png_(self):\n        return %r\n"
                         "    def _repr_html_(self):\n        return '<b>chart</b>'\n"
                         "    def __repr__(self):\n        return 'Chart()'\nChart()" % image)
    assert answer["value"] == "Chart()"
    assert answer["display"] == [{"data": {"image/png": base64.b64encode(image).decode(),
                                           "text/html": "<b>chart</b>", "text/plain": "Chart()"}}]
    # A plain value shows nothing beside its repr, and the next exec starts with nothing.
    assert "display" not in session.run("41 + 1")


def test_display_shows_objects_in_order(session):
    answer = session.run("class J:\n    def _repr_json_(self):\n        return {'a': [1, 2]}\n"
                         "display('text', J())\nclass Fig:\n"
                         "    def savefig(self, f, format):\n        f.write(%r)\n"
                         "from sqbox_tools import display as shown\nshown(Fig())" % png())
    items = [item["data"] for item in answer["display"]]
    assert items[0] == {"text/plain": "'text'"}
    assert items[1]["application/json"] == {"a": [1, 2]}
    assert base64.b64decode(items[2]["image/png"]) == png()


def test_a_broken_representation_keeps_the_value(session):
    answer = session.run("class Bad:\n    def _repr_html_(self):\n        raise ValueError('no')\n"
                         "    def __repr__(self):\n        return 'Bad()'\nBad()")
    assert answer["value"] == "Bad()" and "display" not in answer
    assert "ValueError: no" in answer["stderr"]


def test_display_data_is_capped(session):
    answer = session.run("class Big:\n    def _repr_html_(self):\n        return 'x' * (6 << 20)\n"
                         "display(Big(), Big(), Big(), 'last')")
    assert len(answer["display"]) == 2 and answer["display_truncated"] is True

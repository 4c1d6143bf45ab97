"""Directories in and out of a session's sandbox as tar streams (PROTOCOL.md, "Files").

An upload is a tar made here of a local file or directory, sent in chunks and unpacked by the
driver beneath the destination. A download is the driver's tar of a sandbox path, received in
chunks and unpacked here. The driver shares its process with the session's code, so what a
download brings is hostile: it is unpacked without ever following a symlink, refusing names
that are absolute or go up, leaving out links that point outside the destination, hard links,
devices and FIFOs, and dropping setuid and setgid bits. The server bounds both streams by the
sandbox's writable budget (`--tmpfs-size`).
"""
from __future__ import annotations

import base64
import binascii
import errno
import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Tuple

from ._errors import ProtocolError, SqboxError

CHUNK = 4 << 20  # bytes of tar stream per upload request
SKIPPED_NAMES = 100


@dataclass(frozen=True)
class Transfer:
    """What an `upload()` or `download()` moved: regular files and links made (`files`), bytes
    of file contents (`bytes`), and the names of entries left out (`skipped`: devices, FIFOs,
    sockets, and on download links pointing outside the destination and hard links; at most
    100 names)."""

    files: int
    bytes: int
    skipped: Tuple[str, ...]


# -- upload ------------------------------------------------------------------------------------

def pack(local: "os.PathLike[str] | str") -> IO[bytes]:
    """A temporary file holding a tar of `local` (a directory's contents, or one file), rewound.
    Symlinks are stored as symlinks."""
    path = os.fspath(local)
    if not os.path.exists(path):
        raise FileNotFoundError(f"upload: no such file or directory: {path}")
    archive_file = tempfile.TemporaryFile(prefix="sqbox-upload-")
    try:
        with tarfile.open(fileobj=archive_file, mode="w", format=tarfile.PAX_FORMAT) as archive:
            if os.path.isdir(path):
                for name in sorted(os.listdir(path)):
                    archive.add(os.path.join(path, name), arcname=name)
            else:
                archive.add(path, arcname=os.path.basename(path))
        archive_file.seek(0)
    except BaseException:
        archive_file.close()
        raise
    return archive_file


def archive_source(archive: "bytes | IO[bytes]") -> IO[bytes]:
    """A tar stream given as bytes or a binary file object, as a file object."""
    if isinstance(archive, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(archive))
    if not hasattr(archive, "read"):
        raise TypeError("a tar stream is bytes or a binary file object")
    return archive


def upload_requests(session: str, remote: str, archive_file: IO[bytes]) -> Iterator[Dict[str, Any]]:
    """The upload's requests, one chunk each; the last has "last": true."""
    offset = 0
    chunk = archive_file.read(CHUNK)
    while True:
        following = archive_file.read(CHUNK)
        request: Dict[str, Any] = {"op": "upload", "session": session, "offset": offset,
                                   "data_b64": base64.b64encode(chunk).decode("ascii"),
                                   "last": not following}
        if offset == 0:
            request["path"] = remote
        yield request
        if not following:
            return
        offset += len(chunk)
        chunk = following


def _counts(reply: Mapping[str, Any], what: str) -> Transfer:
    files, size, skipped = reply.get("files"), reply.get("bytes"), reply.get("skipped", [])
    if not (_is_count(files) and _is_count(size) and isinstance(skipped, list) and
            all(isinstance(name, str) for name in skipped)):
        raise ProtocolError(f"{what}: malformed reply: 'files', 'bytes' and 'skipped' must be "
                            "counts and a list of names")
    return Transfer(files=files, bytes=size, skipped=tuple(skipped[:SKIPPED_NAMES]))


def upload_result(reply: Mapping[str, Any]) -> Transfer:
    return _counts(reply, "upload")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- download ----------------------------------------------------------------------------------

def download_request(session: str, remote: str, offset: int) -> Dict[str, Any]:
    request: Dict[str, Any] = {"op": "download", "session": session, "offset": offset}
    if offset == 0:
        request["path"] = remote
    return request


def download_chunk(reply: Mapping[str, Any]) -> Tuple[bytes, bool, List[str]]:
    """(data, last, skipped names) of one download answer; ProtocolError if malformed."""
    data, last, skipped = reply.get("data_b64"), reply.get("last"), reply.get("skipped", [])
    if not isinstance(data, str) or not isinstance(last, bool) or not isinstance(skipped, list) \
            or not all(isinstance(name, str) for name in skipped):
        raise ProtocolError("download: malformed reply: 'data_b64', 'last' and 'skipped' must be "
                            "base64, a bool and a list of names")
    try:
        return base64.b64decode(data, validate=True), last, skipped
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"download: malformed reply: 'data_b64' is not base64: {exc}") from None


def receive(chunks: Callable[[int], Tuple[bytes, bool, List[str]]]) -> Tuple[IO[bytes], List[str]]:
    """The whole stream in a rewound temporary file: `chunks(offset)` answers each request."""
    stream = tempfile.TemporaryFile(prefix="sqbox-download-")
    try:
        offset, skipped = 0, []
        while True:
            data, last, names = chunks(offset)
            stream.write(data)
            offset += len(data)
            skipped += names
            if last:
                break
            if not data:
                raise ProtocolError("download: malformed reply: an empty chunk that is not the "
                                    "last")
        stream.seek(0)
        return stream, skipped
    except BaseException:
        stream.close()
        raise


def _parts(name: str) -> List[str]:
    if name.startswith("/"):
        raise SqboxError(f"download: refused entry {name!r}: an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise SqboxError(f"download: refused entry {name!r}: it goes up with '..'")
    return parts


class _Unpacker:
    """Unpacks a hostile tar beneath a directory: every directory is opened relative to the one
    above with O_NOFOLLOW, so no symlink (of the archive or already there) is ever followed."""

    def __init__(self, destination: str) -> None:
        os.makedirs(destination, exist_ok=True)
        self.root = os.open(destination, os.O_RDONLY | os.O_DIRECTORY)
        self.files = self.bytes = 0
        self.skipped: List[str] = []
        self.directories: List[Tuple[List[str], int, float]] = []

    def close(self) -> None:
        os.close(self.root)

    def walk(self, parts: List[str], create: bool = True) -> int:
        fd = os.dup(self.root)
        try:
            for part in parts:
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                try:
                    child = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o700, dir_fd=fd)
                    child = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise SqboxError(f"download: refused entry under {'/'.join(parts)!r}: "
                                         "a symlink or a file stands in its way") from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def skip(self, name: str) -> None:
        if len(self.skipped) < SKIPPED_NAMES:
            self.skipped.append(name)

    def member(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = _parts(member.name)
        if not parts:
            return
        if member.isdir():
            os.close(self.walk(parts))
            self.directories.append((parts, member.mode & 0o777, member.mtime))
            return
        if member.issym():
            target = member.linkname
            inside = os.path.normpath(os.path.join(*(parts[:-1] + [target]))) if target else ".."
            if target.startswith("/") or inside == ".." or inside.startswith("../"):
                self.skip(member.name)  # would lead out of the destination
                return
        elif not member.isreg():
            self.skip(member.name)  # hard links, devices, FIFOs
            return
        parent = self.walk(parts[:-1])
        try:
            leaf = parts[-1]
            try:
                if stat.S_ISDIR(os.stat(leaf, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise SqboxError(f"download: entry {member.name!r} would replace a directory")
                os.unlink(leaf, dir_fd=parent)
            except FileNotFoundError:
                pass
            if member.issym():
                os.symlink(member.linkname, leaf, dir_fd=parent)
            else:
                self.write(archive, member, parent, leaf)
            self.files += 1
        finally:
            os.close(parent)

    def write(self, archive: tarfile.TarFile, member: tarfile.TarInfo, parent: int,
              leaf: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(leaf, flags, 0o600, dir_fd=parent)
        try:
            source = archive.extractfile(member)
            assert source is not None
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                self.bytes += len(chunk)
            os.chmod(fd, member.mode & 0o777)  # never setuid or setgid
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)

    def finish(self) -> None:
        for parts, mode, mtime in reversed(self.directories):
            fd = self.walk(parts, create=False)
            try:
                os.utime(fd, (mtime, mtime))
                os.chmod(fd, mode | 0o700)  # the caller's own copy: always theirs to change
            finally:
                os.close(fd)


def unpack(stream: IO[bytes], destination: "os.PathLike[str] | str",
           skipped: List[str]) -> Transfer:
    """Unpacks a downloaded tar stream beneath `destination` (made if missing)."""
    unpacker = _Unpacker(os.fspath(destination))
    try:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    unpacker.member(archive, member)
        except (tarfile.TarError, EOFError) as exc:
            raise SqboxError(f"download: the sandbox sent a broken tar stream: {exc}") from None
        unpacker.finish()
    finally:
        unpacker.close()
    names = (skipped + unpacker.skipped)[:SKIPPED_NAMES]
    return Transfer(files=unpacker.files, bytes=unpacker.bytes, skipped=tuple(names))

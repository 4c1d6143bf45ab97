"""sqbox session driver: the long-lived Python interpreter inside a session's sandbox.

The server starts it as `python3 /run/sqbox/driver.py`, stdin and stdout piped to the server, and
speaks newline-delimited JSON with it (PROTOCOL.md, "Inside a session: the driver's protocol").
The file is embedded into the sqbox binary: it stays one self-contained file, standard library
only, and runs on Python 3.8 to 3.13.
"""
import ast
import base64
import builtins
import codecs
import errno
import fcntl
import io
import json
import linecache
import os
import platform
import select
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import types

FILE_CAP = 64 << 20  # put and get payloads, decoded
VALUE_CAP = 64 << 10  # characters of a trailing expression's repr
OUTPUT_LIMIT = 1 << 20  # default cap of captured stdout and stderr, each
F_DUPFD_CLOEXEC = getattr(fcntl, "F_DUPFD_CLOEXEC", 1030)  # 1030 on every Linux
OWN_FILE = (lambda: 0).__code__.co_filename  # frames from this file are left out of tracebacks

# What SIGINT (the server's timeout) does. IDLE: nothing; no code is running. RAISE: user code is
# running: KeyboardInterrupt. DEFER: the driver is talking to the server on behalf of user code
# (a tool call): it remembers the signal and raises KeyboardInterrupt at the next point where
# that cannot leave half a line written or drop input already read.
IDLE, RAISE, DEFER = 0, 1, 2


class ToolError(Exception):
    """A host tool failed. User code sees it as sqbox_tools.ToolError."""

    def __init__(self, type, message):
        super().__init__(type, message)
        self.type, self.message = type, message

    def __str__(self):
        return "%s: %s" % (self.type, self.message)


ToolError.__module__ = "sqbox_tools"  # so that tracebacks and pickle name it as user code does


class Failure(Exception):
    """A request the driver could not carry out: answered with ok false and this error."""

    def __init__(self, type, message):
        super().__init__(message)
        self.type = type


class Tools:
    """`tools` in user code: one callable attribute per host tool name."""

    def __init__(self, call):
        self._call, self._names = call, ()

    def __getattr__(self, name):
        names = self.__dict__.get("_names", ())
        if name not in names:
            raise AttributeError("no tool named %r; this session's tools: %s"
                                 % (name, ", ".join(names) or "none"))

        def tool(*args, **kwargs):
            return self._call(name, args, kwargs)
        tool.__name__ = tool.__qualname__ = name
        return tool

    def __dir__(self):
        return list(self._names)

    def __repr__(self):
        return "<sqbox tools: %s>" % (", ".join(self._names) or "none")


def _field(req, name, kind):
    value = req.get(name)
    if not isinstance(value, kind):
        raise Failure("BadRequest", "%r must be a %s" % (name, kind.__name__))
    return value


def _size(req, name, default):
    value = req.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Failure("BadRequest", "%r must be a non-negative integer" % name)
    return value

class OutputStream:
    """Sends what a running exec writes to its capture files as `output` events (PROTOCOL.md,
    "Streaming output"), from a thread of its own while the code runs, up to the exec's output
    limit. The files stay the capture: the result still carries the whole output. When the
    server stops reading (its client is behind), send() blocks this thread, not the code."""

    INTERVAL = 0.02  # seconds between looks at the files
    CHUNK = 64 << 10  # bytes per event at most

    def __init__(self, driver, files, limit):
        self.driver, self.files, self.limit = driver, files, limit
        self.offsets = [0] * len(files)
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in files]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="sqbox-output", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def finish(self):
        """After the code: the thread stops, and what it has not sent yet goes now."""
        self.stop()
        self._send_new(final=True)

    def _watch(self):
        while not self.done.wait(self.INTERVAL):
            self._send_new()

    def _send_new(self, final=False):
        for index, name in enumerate(("stdout", "stderr")):
            fd, decoder = self.files[index], self.decoders[index]
            end = min(os.fstat(fd).st_size, self.limit)
            while self.offsets[index] < end:
                chunk = os.pread(fd, min(self.CHUNK, end - self.offsets[index]),
                                 self.offsets[index])
                if not chunk:
                    break
                self.offsets[index] += len(chunk)
                self._send(name, decoder.decode(chunk))
            if final:
                self._send(name, decoder.decode(b"", True))

    def _send(self, name, text):
        if text:
            self.driver.send({"event": "output", "seq": self.driver.seq, "stream": name,
                              "data": text})


class BackgroundProcess:
    __slots__ = ("popen", "files", "offsets", "decoders")

    def __init__(self, popen, files):
        self.popen, self.files, self.offsets = popen, files, [0] * len(files)
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in files]


class BackgroundProcesses:
    """Commands started beside the interpreter (PROTOCOL.md, "Background processes"), each in a
    process group of its own, stdin from /dev/null, stdout and stderr into unlinked files of the
    sandbox's temporary directory (so a process nobody reads never blocks). They die with the
    sandbox: the session's end kills every process in it."""

    MAX = 1024  # processes started in one session's life

    def __init__(self):
        self.table, self.started = {}, 0

    def get(self, req):
        process = self.table.get(_field(req, "process", str))
        if process is None:
            raise Failure("NoSuchProcess", "no background process %r" % req.get("process"))
        return process

    def start(self, driver, req):
        import subprocess  # here: most sessions never start a process
        command = _field(req, "command", list)
        if not command or not all(isinstance(part, str) for part in command):
            raise Failure("BadRequest", "'command' must be a non-empty list of strings")
        env = req.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in env.items()):
            raise Failure("BadRequest", "'env' must map strings to strings")
        workdir = req.get("workdir")
        if workdir is not None and not isinstance(workdir, str):
            raise Failure("BadRequest", "'workdir' must be a string")
        if self.started >= self.MAX:
            raise Failure("TooMany", "a session starts at most %d background processes" % self.MAX)
        files = []
        try:
            for _ in range(2):
                fd, path = tempfile.mkstemp(prefix="sqbox-process-", dir=driver.tmpdir)
                files.append(fd)
                os.unlink(path)
            popen = subprocess.Popen(command, stdin=driver.devnull, stdout=files[0],
                                     stderr=files[1], env=dict(os.environ, **env), cwd=workdir,
                                     start_new_session=True)
        except BaseException:
            for fd in files:
                os.close(fd)
            raise
        self.started += 1
        name = "p%d" % self.started
        self.table[name] = BackgroundProcess(popen, files)
        return {"ok": True, "process": name, "pid": popen.pid}

    @staticmethod
    def status(process):
        code = process.popen.poll()
        if code is None:
            return {"running": True, "exit_code": None, "signal": None}
        if code < 0:  # as sqbox run reports a signal: 128 + N
            return {"running": False, "exit_code": 128 - code, "signal": -code}
        return {"running": False, "exit_code": code, "signal": None}

    def read(self, req):
        process, limit = self.get(req), _size(req, "limit", OUTPUT_LIMIT)
        result = dict({"ok": True}, **self.status(process))  # first: all it wrote before it ended
        for index, name in enumerate(("stdout", "stderr")):
            fd, start = process.files[index], process.offsets[index]
            size = os.fstat(fd).st_size
            chunk = os.pread(fd, min(limit, max(0, size - start)), start) if size > start else b""
            process.offsets[index] += len(chunk)
            ended = not result["running"] and process.offsets[index] >= size
            result[name] = process.decoders[index].decode(chunk, ended)
            result[name + "_pending"] = max(0, size - process.offsets[index])
        return result

    def wait(self, req):
        import subprocess
        process, timeout = self.get(req), req.get("timeout")
        if timeout is not None and (not isinstance(timeout, (int, float))
                                    or isinstance(timeout, bool) or timeout < 0):
            raise Failure("BadRequest", "'timeout' must be a non-negative number")
        try:
            process.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return dict({"ok": True}, **self.status(process))

    def kill(self, req):
        process, number = self.get(req), req.get("signal", signal.SIGKILL)
        if not isinstance(number, int) or isinstance(number, bool):
            raise Failure("BadRequest", "'signal' must be a signal number")
        try:  # the whole group, also once its leader has ended: a shell's children too
            os.killpg(process.popen.pid, number)
        except ProcessLookupError:
            pass
        return dict({"ok": True}, **self.status(process))


# ---- Directories in and out: tar streams (PROTOCOL.md, "Files") ----
#
# The driver runs inside the session's sandbox, so no path it resolves can lead out of it; what
# these classes keep to is the client's request: an upload writes only beneath its destination
# (no absolute names, no "..", no link pointing out, never through a symlink already there) and a
# download reads only beneath its source (symlinks are sent as symlinks, never followed). The
# server counts both streams against the sandbox's writable budget too; the client checks what it
# unpacks on the host, since code in the session can replace this driver.

TRANSFER_CHUNK = 4 << 20  # bytes of tar stream per download answer
BLOCK = 512  # a tar block
SKIPPED_NAMES = 100  # names of entries left out that an answer lists, at most


def _entry_parts(name, what="entry"):
    """The components of a name in an uploaded tar, or Failure if it could lead out."""
    if name.startswith("/"):
        raise Failure("UnsafeEntry", "%s %r is an absolute path" % (what, name))
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Failure("UnsafeEntry", "%s %r goes up with '..'" % (what, name))
    return parts


def _open_dir_at(parent, name, create):
    """A directory beneath `parent`, made if `create`; never through a symlink."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o700, dir_fd=parent)  # its own mode comes when the upload ends
        return os.open(name, flags, dir_fd=parent)


def _remove_non_directory(parent, name):
    """Makes room for a new entry: a file or symlink already there goes (never followed)."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise Failure("UnsafeEntry", "%r is a directory in the sandbox" % name)
    os.unlink(name, dir_fd=parent)


def _note_skipped(names, name):
    if len(names) < SKIPPED_NAMES:
        names.append(name)


class Upload:
    """One tar stream being unpacked beneath a directory, fed chunk by chunk; a thread reads
    the stream from a pipe (tarfile reads stream formats, gzip included, only from a file)."""

    def __init__(self, destination):
        os.makedirs(destination, exist_ok=True)
        self.root = os.open(destination, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        read_end, self.write_end = os.pipe()
        self.offset, self.files, self.bytes, self.skipped = 0, 0, 0, []
        self.error, self.directories = None, []
        self.thread = threading.Thread(target=self._unpack, args=(read_end,), daemon=True)
        self.thread.start()

    def feed(self, data):
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.write_end, view):]
        except BrokenPipeError:  # the unpacker stopped: its error (or the archive's end) says why
            pass
        self.offset += len(data)
        if self.error is not None:
            raise self.error

    def finish(self):
        """Waits for the unpacker; returns the counts or raises its error."""
        self.close()
        if self.error is not None:
            raise self.error
        return {"files": self.files, "bytes": self.bytes, "skipped": self.skipped}

    def close(self):
        if self.write_end is not None:
            os.close(self.write_end)
            self.write_end = None
            self.thread.join()
            os.close(self.root)

    def _unpack(self, read_end):
        with open(read_end, "rb") as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|*") as archive:
                    for member in archive:
                        self._member(archive, member)
                for parts, mode, mtime in reversed(self.directories):  # deepest first
                    fd = self._walk(parts, create=False)
                    try:
                        os.utime(fd, (mtime, mtime))
                        os.chmod(fd, mode)
                    finally:
                        os.close(fd)
            except Failure as exc:
                self.error = exc
            except (tarfile.TarError, EOFError) as exc:
                self.error = Failure("BadArchive", "the upload is not a tar stream: %s" % exc)
            except OSError as exc:
                self.error = Failure(type(exc).__name__, str(exc))
            except Exception as exc:  # a bug here must not leave the writer waiting
                self.error = Failure(type(exc).__name__, str(exc))

    def _walk(self, parts, create=True):
        fd = os.dup(self.root)
        try:
            for part in parts:
                try:
                    child = _open_dir_at(fd, part, create)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Failure("UnsafeEntry", "%r is a symlink or not a directory in "
                                      "the sandbox; not followed" % "/".join(parts))
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _member(self, archive, member):
        parts = _entry_parts(member.name)
        if not parts:
            return
        if member.isdir():
            os.close(self._walk(parts))
            self.directories.append((parts, member.mode & 0o777, member.mtime))
            return
        if not (member.isreg() or member.issym() or member.islnk()):
            _note_skipped(self.skipped, member.name)  # devices, FIFOs: not from a tar
            return
        parent = self._walk(parts[:-1])
        try:
            leaf = parts[-1]
            _remove_non_directory(parent, leaf)
            if member.issym():
                target = member.linkname
                inside = os.path.normpath(os.path.join(*(parts[:-1] + [target]))) \
                    if target else ".."
                if target.startswith("/") or inside == ".." or inside.startswith("../"):
                    raise Failure("UnsafeEntry", "symlink %r points outside the destination "
                                  "(%r)" % (member.name, target))
                os.symlink(target, leaf, dir_fd=parent)
            elif member.islnk():
                source = _entry_parts(member.linkname, "hard link target")
                if not source:
                    raise Failure("UnsafeEntry", "hard link %r has no target" % member.name)
                source_parent = self._walk(source[:-1], create=False)
                try:
                    os.link(source[-1], leaf, src_dir_fd=source_parent, dst_dir_fd=parent,
                            follow_symlinks=False)
                finally:
                    os.close(source_parent)
            else:
                self._write_file(archive, member, parent, leaf)
            self.files += 1
        finally:
            os.close(parent)

    def _write_file(self, archive, member, parent, leaf):
        # O_NONBLOCK: should a FIFO appear in the meantime, opening it does not wait for a reader.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | \
            os.O_CLOEXEC
        fd = os.open(leaf, flags, 0o600, dir_fd=parent)
        try:
            source = archive.extractfile(member)
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


class Download:
    """A tar stream of a file or a directory's contents, made as it is read. Regular files,
    directories and symlinks (as links); others are skipped. Each file is sent with the size it
    had when opened, so a file that keeps growing cannot make the stream endless, and the
    stream stops with TooLarge before it would pass `limit` bytes."""

    def __init__(self, path, limit):
        self.limit, self.offset, self.made, self.skipped = limit, 0, 0, []
        self.pending, self.done = bytearray(), False
        self.stream = self._archive(path)

    def next_chunk(self, size):
        while len(self.pending) < size and not self.done:
            try:
                self.pending += next(self.stream)
            except StopIteration:
                self.done = True
        chunk = bytes(self.pending[:size])
        del self.pending[:size]
        self.offset += len(chunk)
        return chunk, self.done and not self.pending

    def close(self):
        self.stream.close()  # runs the generators' finally clauses: their descriptors close

    def _archive(self, path):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                for piece in self._directory(fd, ""):
                    yield piece
            elif stat.S_ISREG(st.st_mode):
                for piece in self._file(fd, st, os.path.basename(path.rstrip("/")) or "file"):
                    yield piece
            else:
                raise Failure("NotSupported", "%s is neither a directory nor a regular file"
                              % path)
        finally:
            os.close(fd)
        yield self._account("", 2 * BLOCK, b"\0" * (2 * BLOCK))

    def _account(self, name, size, piece=None):
        # The end-of-archive blocks are always left room for.
        if self.made + size + 2 * BLOCK > self.limit and name:
            raise Failure("TooLarge", "%s: the download would pass the sandbox's writable budget "
                          "of %d bytes" % (name, self.limit))
        self.made += size
        return piece

    def _header(self, name, kind, st, size=0, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.size, info.linkname = kind, size, link
        info.mode, info.mtime = st.st_mode & 0o777, int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")

    def _directory(self, fd, prefix):
        with os.scandir(fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            path = prefix + name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    header = self._header(path, tarfile.SYMTYPE, st,
                                          link=os.readlink(name, dir_fd=fd))
                    yield self._account(path, len(header), header)
                elif stat.S_ISDIR(st.st_mode):
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                                    os.O_CLOEXEC, dir_fd=fd)
                    try:
                        header = self._header(path + "/", tarfile.DIRTYPE, os.fstat(child))
                        yield self._account(path, len(header), header)
                        for piece in self._directory(child, path + "/"):
                            yield piece
                    finally:
                        os.close(child)
                elif stat.S_ISREG(st.st_mode):
                    child = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                                    os.O_CLOEXEC, dir_fd=fd)
                    try:
                        st = os.fstat(child)  # what was opened, not what was there before
                        if stat.S_ISREG(st.st_mode):
                            for piece in self._file(child, st, path):
                                yield piece
                        else:
                            _note_skipped(self.skipped, path)
                    finally:
                        os.close(child)
                else:
                    _note_skipped(self.skipped, path)  # devices, FIFOs, sockets
            except FileNotFoundError:  # removed while we walk
                continue

    def _file(self, fd, st, path):
        size = st.st_size
        header = self._header(path, tarfile.REGTYPE, st, size=size)
        padded = -size % BLOCK
        yield self._account(path, len(header) + size + padded, header)
        left = size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:  # it shrank: the header's size is kept
                chunk = b"\0" * min(left, 1 << 20)
            left -= len(chunk)
            yield chunk
        if padded:
            yield b"\0" * padded


class Transfers:
    """The session's upload and download under way (at most one of each). A stream goes on
    from the offset where the last chunk ended; offset 0 starts a new one."""

    def __init__(self):
        self.upload = self.download = None

    def op_upload(self, req):
        offset, last = _size(req, "offset", 0), req.get("last", False)
        data = _field(req, "data_b64", str)
        if not isinstance(last, bool):
            raise Failure("BadRequest", "'last' must be a bool")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise Failure("BadRequest", "data_b64 is not base64: %s" % exc)
        if offset == 0:
            self._drop_upload()
            self.upload = Upload(_field(req, "path", str))
        elif self.upload is None or self.upload.offset != offset:
            raise Failure("TransferInterrupted", "no upload is at offset %d; start again at 0"
                          % offset)
        try:
            self.upload.feed(raw)
            if not last:
                return {"ok": True}
            upload, self.upload = self.upload, None
            return dict({"ok": True}, **upload.finish())
        except BaseException:
            self._drop_upload()
            raise

    def op_download(self, req):
        offset = _size(req, "offset", 0)
        if offset == 0:
            self._drop_download()
            self.download = Download(_field(req, "path", str), _size(req, "limit", 1 << 30))
        elif self.download is None or self.download.offset != offset:
            raise Failure("TransferInterrupted", "no download is at offset %d; start again at 0"
                          % offset)
        try:
            chunk, last = self.download.next_chunk(TRANSFER_CHUNK)
        except BaseException:
            self._drop_download()
            raise
        answer = {"ok": True, "data_b64": base64.b64encode(chunk).decode("ascii"), "last": last}
        if last:
            answer["skipped"] = self.download.skipped
            self._drop_download()
        return answer

    def _drop_upload(self):
        upload, self.upload = self.upload, None
        if upload is not None:
            upload.close()

    def _drop_download(self):
        download, self.download = self.download, None
        if download is not None:
            download.close()


# ---- Shells beside the interpreter (PROTOCOL.md, "Shells") ----
#
# A shell reads its commands from a pipe, one at a time: each is run by `eval` inside a brace
# group (so `cd`, variables and functions stay in the shell), its output appended to two files
# by name, and then the shell writes "TOKEN STATUS" on its stdout, a pipe only the driver reads.

SHELL_KILL_GRACE = 1.0  # seconds between SIGINT, SIGKILL and giving the shell up, on timeout


def _quoted(text):
    return "'" + text.replace("'", "'\\''") + "'"


def _descendants(pid):
    """Process ids below `pid` (from /proc's children lists)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir("/proc/%d/task" % parent)
        except OSError:
            continue
        for task in tasks:
            try:
                with open("/proc/%d/task/%s/children" % (parent, task)) as f:
                    children = [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


class Shell:
    def __init__(self, program, tmpdir):
        # Interactive, as in a terminal: SIGINT ends the command being run (a builtin loop
        # included) and the shell reads the next one, keeping its state.
        setup = b""
        if program is None:
            program = [shutil.which("bash") or "/bin/sh"]
            if os.path.basename(program[0]) == "bash":
                program += ["--noprofile", "--norc"]
                setup = b"set +H\n"  # no history expansion: "!" means itself
            program += ["-i"]
        self.token = "sqbox-%s" % base64.b16encode(os.urandom(16)).decode("ascii")
        self.dir = tempfile.mkdtemp(prefix="sqbox-shell-", dir=tmpdir)
        self.out, self.err = os.path.join(self.dir, "stdout"), os.path.join(self.dir, "stderr")
        for path in (self.out, self.err):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.buf = b""
        try:
            self.proc = subprocess.Popen(program, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise Failure("ShellError", "cannot start %s: %s" % (" ".join(program), exc))
        self._write(setup + b"PS1= PS2=\n")

    def _write(self, data):
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError:
            pass  # the shell is gone: reading its status says so

    def run(self, command, timeout, limit):
        before = set(_descendants(self.proc.pid))  # background jobs of earlier commands
        for path in (self.out, self.err):
            os.truncate(path, 0)
        script = "{ eval %s\n} </dev/null >>%s 2>>%s\nprintf '%%s %%d\\n' %s \"$?\"\n" % (
            _quoted(command), _quoted(self.out), _quoted(self.err), self.token)
        self._write(script.encode("utf-8", "surrogateescape"))
        deadline = None if timeout is None else time.monotonic() + timeout
        status, timed_out = self._status(deadline), False
        if status is False:
            # Timed out: SIGINT to the shell's process group, as a terminal's ^C (background
            # jobs ignore it, as without job control they do); then SIGKILL to the processes
            # this command started; then the shell goes, with its state.
            timed_out = True
            for step in ("interrupt", "kill"):
                try:
                    if step == "interrupt":
                        os.killpg(self.proc.pid, signal.SIGINT)
                    else:
                        for pid in set(_descendants(self.proc.pid)) - before:
                            os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                status = self._status(time.monotonic() + SHELL_KILL_GRACE)
                if status is not False:
                    break
            if status is False:
                self.kill()
                status = None
        (stdout, stdout_cut), (stderr, stderr_cut) = [self._captured(path, limit)
                                                      for path in (self.out, self.err)]
        answer = {"ok": True, "stdout": stdout, "stderr": stderr, "stdout_truncated": stdout_cut,
                  "stderr_truncated": stderr_cut, "timed_out": timed_out, "shell_exited": False}
        if status is None:  # no status line: the shell exited (`exit 3`) or was killed
            try:
                code = self.proc.wait(SHELL_KILL_GRACE)
            except subprocess.TimeoutExpired:
                code = None
            self.kill()
            answer["shell_exited"] = True
            status = code if code is not None and code >= 0 and not timed_out else None
        answer["exit_code"] = status
        return answer

    def _status(self, deadline):
        """The command's status; None if the shell closed its stdout, False at the deadline."""
        fd = self.proc.stdout.fileno()
        marker = self.token.encode("ascii") + b" "
        while True:
            at = self.buf.find(marker)
            if at >= 0 and b"\n" in self.buf[at:]:
                end = self.buf.index(b"\n", at)
                text, self.buf = self.buf[at + len(marker):end], self.buf[end + 1:]
                try:
                    return int(text)
                except ValueError:
                    return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if not select.select([fd], [], [], left)[0]:
                return False
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf = (self.buf + chunk)[-65536:]  # only the last status line matters

    @staticmethod
    def _captured(path, limit):
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except OSError:
            return "", False
        return data[:limit].decode("utf-8", "replace"), len(data) > limit

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Shells:
    """The session's shells, by name: each keeps its working directory and variables."""

    def __init__(self, tmpdir):
        self.tmpdir, self.shells = tmpdir, {}

    def op_shell(self, req):
        command, name = _field(req, "command", str), req.get("name", "main")
        limit = _size(req, "output_limit", OUTPUT_LIMIT)
        timeout, program = req.get("timeout"), req.get("program")
        if not isinstance(name, str):
            raise Failure("BadRequest", "'name' must be a str")
        if "\0" in command:
            raise Failure("BadRequest", "a command cannot hold a NUL character")
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or not timeout > 0):
            raise Failure("BadRequest", "'timeout' must be a positive number")
        if program is not None and not (isinstance(program, list) and program and
                                        all(isinstance(arg, str) for arg in program)):
            raise Failure("BadRequest", "'program' must be a non-empty list of strings")
        shell = self.shells.get(name)
        if shell is None:
            shell = self.shells[name] = Shell(program, self.tmpdir)
        answer = shell.run(command, timeout, limit)
        if answer["shell_exited"]:
            del self.shells[name]
        return answer

    def op_shell_close(self, req):
        shell = self.shells.pop(req.get("name", "main"), None)
        if shell is not None:
            shell.kill()
        return {"ok": True, "closed": shell is not None}


# ---- Rich results: display data beside the text (PROTOCOL.md, "Rich results") ----

DISPLAY_CAP = 16 << 20  # bytes of display data per exec, as JSON
REPR_METHODS = (("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"),
                ("image/svg+xml", "_repr_svg_"), ("text/html", "_repr_html_"),
                ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"),
                ("application/json", "_repr_json_"))


class RichOutput:
    """What an exec displayed: `display(obj)` in user code, and a trailing expression whose
    object has rich representations (`_repr_png_`, `_repr_html_`, ... as IPython reads them,
    or a matplotlib figure's PNG). Each item is {"data": {MIME type: value}}; images base64."""

    def __init__(self):
        self.items, self.size, self.truncated = [], 0, False

    def clear(self):
        self.items, self.size, self.truncated = [], 0, False

    def take(self):
        fields = {"display": self.items} if self.items else {}
        if self.truncated:
            fields["display_truncated"] = True
        self.clear()
        return fields

    def display(self, *objects):
        """Shows each object as a notebook would: its rich representations and its repr."""
        for obj in objects:
            self._add(dict(self._bundle(obj), **{"text/plain": self._plain(obj)}))

    def show(self, value):
        """A trailing expression's value: shown only if it has rich representations. A broken
        representation is reported on stderr, as IPython does, and the value's repr stays."""
        try:
            data = self._bundle(value)
        except Exception as exc:
            sys.stderr.write("display: %s: %s\n" % (type(exc).__name__, exc))
            return
        if data:
            self._add(dict(data, **{"text/plain": self._plain(value)}))

    @staticmethod
    def _plain(obj):
        text = repr(obj)
        return text[:VALUE_CAP] + "...[truncated]" if len(text) > VALUE_CAP else text

    @staticmethod
    def _bundle(obj):
        data = {}
        if isinstance(obj, type):  # a class defining _repr_png_ is not an image
            return data
        bundle = getattr(obj, "_repr_mimebundle_", None)
        if callable(bundle):
            value = bundle()
            if isinstance(value, tuple) and value:
                value = value[0]
            if isinstance(value, dict):
                for mime, item in value.items():
                    encoded = RichOutput._encode(mime, item)
                    if isinstance(mime, str) and encoded is not None:
                        data[mime] = encoded
        for mime, name in REPR_METHODS:
            method = getattr(obj, name, None)
            if mime not in data and callable(method):
                encoded = RichOutput._encode(mime, method())
                if encoded is not None:
                    data[mime] = encoded
        savefig = getattr(obj, "savefig", None)  # a matplotlib figure
        if "image/png" not in data and callable(savefig):
            buffer = io.BytesIO()
            savefig(buffer, format="png")
            data["image/png"] = base64.b64encode(buffer.getvalue()).decode("ascii")
        data.pop("text/plain", None)
        return data

    @staticmethod
    def _encode(mime, value):
        if isinstance(value, tuple) and value:  # (data, metadata), as IPython allows
            value = value[0]
        if value is None:
            return None
        if mime in ("image/png", "image/jpeg"):
            if isinstance(value, (bytes, bytearray)):
                return base64.b64encode(bytes(value)).decode("ascii")
            return value if isinstance(value, str) else None  # already base64
        if mime == "application/json" or mime.endswith("+json"):
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                return None
            return value
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8", "replace")
        return value if isinstance(value, str) else str(value)

    def _add(self, data):
        size = len(json.dumps(data, ensure_ascii=False))
        if self.truncated or self.size + size > DISPLAY_CAP:  # later items are left out too
            self.truncated = True
            return
        self.size += size
        self.items.append({"data": data})


class Driver:
    def __init__(self):
        # Installed first: the default handler would let a SIGINT kill an idle driver.
        self.mode, self.fired, self.missed, self.running = IDLE, False, False, False
        signal.signal(signal.SIGINT, self._on_sigint)
        # The protocol channel moves above fd 2, close-on-exec, so that user subprocesses never
        # inherit it; fds 0-2 then belong to user code: /dev/null, or capture files during exec.
        self.proto_in = fcntl.fcntl(0, F_DUPFD_CLOEXEC, 3)
        self.proto_out = fcntl.fcntl(1, F_DUPFD_CLOEXEC, 3)
        try:
            self.log_fd = fcntl.fcntl(2, F_DUPFD_CLOEXEC, 3)  # the server's log, for crashes
        except OSError:
            self.log_fd = None
        fd = os.open(os.devnull, os.O_RDWR)
        self.devnull = fcntl.fcntl(fd, F_DUPFD_CLOEXEC, 3)
        os.close(fd)
        for target in (0, 1, 2):
            os.dup2(self.devnull, target)
        self.buf, self.scanned = bytearray(), 0  # protocol input not yet returned as lines
        self.pid, self.execs, self.calls = os.getpid(), 0, 0
        # The server's token (its hello) goes into every message, and the sequence number of the
        # request being served into its result and tool calls: the server takes nothing else
        # (PROTOCOL.md). Requests that arrive while code waits for a tool wait in `deferred`.
        self.token, self.seq, self.deferred = None, None, []
        # An exec's OutputStream thread sends too: one line at a time on the channel.
        self.send_lock = threading.Lock()
        self.processes = BackgroundProcesses()
        self.tmpdir = tempfile.gettempdir()
        self.tools = Tools(self._call_tool)
        module = types.ModuleType("sqbox_tools", "Host tools of this sqbox session.")
        module.ToolError, module.tools = ToolError, self.tools
        sys.modules["sqbox_tools"] = module
        # User code gets a module of its own as __main__, so that pickle, dataclasses and
        # `import __main__` find what it defines; the driver's module is kept alive here.
        self.own_module = sys.modules.get("__main__")
        main = types.ModuleType("__main__")
        main.__builtins__, main.tools = builtins, self.tools
        self.rich, self.transfers, self.shells = RichOutput(), Transfers(), Shells(self.tmpdir)
        main.display = module.display = self.rich.display
        sys.modules["__main__"] = main
        self.globals = main.__dict__
        # Like an interactive interpreter: no script arguments, imports from the working directory.
        sys.argv = [""]
        here = os.path.dirname(os.path.realpath(OWN_FILE))
        if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
            sys.path[0] = ""

    # SIGINT strategy. A handler that decides, rather than blocking the signal with
    # pthread_sigmask outside exec: a blocked SIGINT stays pending and would hit the *next* exec,
    # and Python runs handlers between bytecodes, so a signal that arrives as user code finishes
    # would still raise in the driver's own code. Here an idle driver ignores SIGINT (reads and
    # writes are retried, PEP 475), and at most one KeyboardInterrupt is raised per exec, so the
    # driver's code that reports it can never be interrupted in turn.
    def _on_sigint(self, signum, frame):
        if self.mode == IDLE or self.fired:
            return
        if self.mode == DEFER:
            self.missed = True
            return
        self.fired = True
        raise KeyboardInterrupt

    def _raise_missed(self):
        if self.missed and not self.fired:
            self.missed, self.fired = False, True
            raise KeyboardInterrupt

    # Protocol I/O. Lines are encoded as UTF-8 with lone surrogates (from undecodable file names,
    # say) replaced: ensure_ascii would turn them into \udXXX escapes strict JSON parsers reject.
    def send(self, obj):
        obj = dict(obj, token=self.token)
        view = memoryview(json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace") + b"\n")
        try:
            with self.send_lock:
                while view:
                    view = view[os.write(self.proto_out, view):]
        except OSError:  # the server is gone
            os._exit(0)

    def readline(self, interruptible=False):
        """The next line from the server; b"" at EOF. Our own buffer, not io.BufferedReader:
        a KeyboardInterrupt inside BufferedReader.readline loses the part of a line read so far."""
        while True:
            end = self.buf.find(b"\n", self.scanned)
            if end >= 0:
                line = bytes(self.buf[:end + 1])
                del self.buf[:end + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buf)
            if interruptible:
                self._wait_readable()
            chunk = os.read(self.proto_in, 1 << 20)
            if not chunk:
                return b""
            self.buf += chunk

    def _wait_readable(self):
        # select consumes no input, so a KeyboardInterrupt raised while it waits loses nothing;
        # the mode switches first so that a SIGINT just before it is seen by _raise_missed.
        self.mode = RAISE
        try:
            self._raise_missed()
            select.select([self.proto_in], [], [])
        finally:
            self.mode = DEFER

    def serve(self):
        self.hello()
        self.send({"event": "ready", "python": platform.python_version()})
        while True:
            if self.deferred:
                line, req = self.deferred.pop(0)
                self.answer(line, req)
                continue
            line = self.readline()
            if not line:
                os._exit(0)  # not sys.exit: threads user code left running must not hold us
            self.answer(line)

    def hello(self):
        """The server's first line gives the token; no code of the session's has run yet."""
        line = self.readline()
        if not line:
            os._exit(0)
        req = self.parse(line)
        token = req.get("token")
        if req.get("op") != "hello" or not isinstance(token, str):
            raise Failure("BadRequest", "the first request must be a hello with a token")
        self.token = token

    def parse(self, line):
        try:
            req = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise Failure("BadRequest", "malformed JSON: %s" % exc)
        if not isinstance(req, dict):
            raise Failure("BadRequest", "a request must be a JSON object")
        return req

    def answer(self, line, req=None):
        """Carries out one request and sends its result (none for a stale tool_result)."""
        seq = None
        try:
            req = self.parse(line) if req is None else req
            seq = req.get("seq")
            op = req.get("op")
            if op == "tool_result":
                # Not a call this driver awaits (_call_tool takes those): the answer to a call
                # whose exec was interrupted. Like the client's tool_result, it gets no answer:
                # the server would take one for the result of the request it is running.
                return
            handler = self.OPS.get(op)
            if handler is None:
                raise Failure("BadRequest", "unknown op %r" % (op,))
            result = handler(self, req)
        except Failure as exc:
            result = {"ok": False, "error": {"type": exc.type, "message": str(exc)}}
        except Exception as exc:  # OSError from put or get, mostly
            result = {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc)}}
        self.send(dict({"event": "result", "seq": seq}, **result))

    # Requests.
    def op_exec(self, req):
        if self.running:
            raise Failure("BadRequest", "code is already running in this session")
        code, limit = _field(req, "code", str), _size(req, "output_limit", OUTPUT_LIMIT)
        self.seq = req.get("seq")
        self.execs += 1
        filename = "<exec-%d>" % self.execs
        # Tracebacks and inspect find the code's lines here, also for functions called by later
        # execs; an mtime of None keeps linecache.checkcache from dropping the entry.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        stream = req.get("stream") is True
        self.rich.clear()
        files, streamer = [], None
        try:
            for _ in range(2):
                fd, path = tempfile.mkstemp(prefix="sqbox-exec-", dir=self.tmpdir)
                files.append(fd)
                os.unlink(path)
            if stream:
                streamer = OutputStream(self, files, limit)
            value, error = self._run(code, filename, files, streamer)
            if os.getpid() != self.pid:  # a fork of user code that returned: it is not the driver
                os._exit(1 if error else 0)
            if streamer is not None:
                streamer.finish()  # every output event goes before the result
            # Streamed, the result holds what the events did (a child of the code may write on).
            ends = streamer.offsets if streamer is not None else [None] * len(files)
            (stdout, stdout_cut), (stderr, stderr_cut) = [
                self._captured(fd, limit, end) for fd, end in zip(files, ends)]
        finally:
            if streamer is not None:
                streamer.stop()  # before its files close
            for fd in files:
                os.close(fd)
        # timed_out: the driver cannot tell; the server, which sent the SIGINT, sets it.
        return {"ok": True, "stdout": stdout, "stderr": stderr, "stdout_truncated": stdout_cut,
                "stderr_truncated": stderr_cut, "value": value, "error": error, "timed_out": False,
                **self.rich.take()}

    def _run(self, code, filename, files, streamer=None):
        self._flush()
        os.dup2(self.devnull, 0)  # in case user code closed or replaced it
        os.dup2(files[0], 1)
        os.dup2(files[1], 2)
        # Fresh wrappers each time: user code may have closed or replaced sys.stdout.
        sys.stdout, sys.stderr = [open(fd, "w", buffering=1, encoding="utf-8", errors="replace",
                                       closefd=False) for fd in (1, 2)]
        self.fired = self.missed = False
        self.running = True
        if streamer is not None:
            streamer.start()
        value = error = None
        try:
            # The nesting makes the mode IDLE before anything reports: a SIGINT that lands as the
            # code finishes is raised at the latest in the finally clause, and reported.
            try:
                self.mode = RAISE
                try:
                    tree = ast.parse(code, filename)
                except (SyntaxError, ValueError) as exc:  # the user's error: not ast.py's frames
                    raise exc.with_traceback(None)
                last = tree.body[-1] if tree.body else None
                if isinstance(last, ast.Expr):
                    del tree.body[-1]
                exec(compile(tree, filename, "exec"), self.globals)
                if isinstance(last, ast.Expr):
                    result = eval(compile(ast.Expression(last.value), filename, "eval"),
                                  self.globals)
                    # None gives null, as an interactive interpreter shows nothing for it (and a
                    # trailing print(...) should not report "None").
                    if result is not None:
                        self.rich.show(result)
                        value = repr(result)
                        if len(value) > VALUE_CAP:
                            value = value[:VALUE_CAP] + "...[truncated]"
            finally:
                self.mode = IDLE
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: we stay alive
            error = self._describe(exc)
        finally:
            self.running = False
            self._flush()
            os.dup2(self.devnull, 1)
            os.dup2(self.devnull, 2)
            signal.signal(signal.SIGINT, self._on_sigint)  # user code may have replaced it
        return value, error

    @staticmethod
    def _flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass

    @staticmethod
    def _captured(fd, limit, end=None):
        size = os.fstat(fd).st_size
        want, chunks, offset = min(size, limit) if end is None else end, [], 0
        while offset < want:  # pread leaves the offset, shared with children still writing, alone
            chunk = os.pread(fd, want - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace"), size > limit

    @staticmethod
    def _describe(exc):
        try:
            message = str(exc)
        except Exception:
            message = "<unprintable %s>" % type(exc).__name__
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        todo, seen = [report], set()
        while todo:  # drop the driver's frames, from chained and grouped exceptions too
            item = todo.pop()
            if item is None or id(item) in seen:
                continue
            seen.add(id(item))
            item.stack = traceback.StackSummary.from_list(
                [frame for frame in item.stack if frame.filename != OWN_FILE])
            todo += [item.__cause__, item.__context__]
            todo += getattr(item, "exceptions", None) or []  # ExceptionGroup, 3.11+
        return {"type": type(exc).__name__, "message": message,
                "traceback": "".join(report.format())}

    def op_put(self, req):
        path, data = _field(req, "path", str), _field(req, "data_b64", str)
        if len(data) > 2 * FILE_CAP:  # surely too large: do not even decode it
            raise Failure("TooLarge", "data is larger than %d bytes" % FILE_CAP)
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise Failure("BadRequest", "data_b64 is not base64: %s" % exc)
        if len(raw) > FILE_CAP:
            raise Failure("TooLarge", "data is larger than %d bytes" % FILE_CAP)
        with open(path, "wb") as f:
            f.write(raw)
        return {"ok": True}

    def op_get(self, req):
        path, limit = _field(req, "path", str), min(_size(req, "limit", FILE_CAP), FILE_CAP)
        # O_NONBLOCK: a FIFO without a writer gives EOF rather than blocking the session.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise Failure("TooLarge", "%s is larger than %d bytes" % (path, limit))
        return {"ok": True, "data_b64": base64.b64encode(data).decode("ascii")}

    def op_tools(self, req):
        names = req.get("names")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise Failure("BadRequest", "'names' must be a list of strings")
        self.tools._names = tuple(names)
        return {"ok": True}

    OPS = {"exec": op_exec, "put": op_put, "get": op_get, "tools": op_tools,
           "upload": lambda self, req: self.transfers.op_upload(req),
           "download": lambda self, req: self.transfers.op_download(req),
           "shell": lambda self, req: self.shells.op_shell(req),
           "shell_close": lambda self, req: self.shells.op_shell_close(req),
           "process_start": lambda self, req: self.processes.start(self, req),
           "process_read": lambda self, req: self.processes.read(req),
           "process_wait": lambda self, req: self.processes.wait(req),
           "process_kill": lambda self, req: self.processes.kill(req)}

    # Tool calls, made by user code: synchronous, so a tool called from code that a tool call
    # started again later simply works. Other requests that arrive meanwhile wait until the code
    # has finished, as they would in an interpreter that runs one request after the other (the
    # server sends none while it waits for a result, unless a forged result answered the exec:
    # then the next request still gets its own answer). Call ids count on over the session, so
    # an answer to an abandoned call never matches.
    def _call_tool(self, name, args, kwargs):
        if not self.running or os.getpid() != self.pid or \
                threading.current_thread() is not threading.main_thread():
            raise RuntimeError("tools can be called only by running session code, "
                               "in its main thread")
        call_id = "c%d" % (self.calls + 1)
        try:
            line = {"event": "tool_call", "seq": self.seq, "call_id": call_id, "name": name,
                    "args": list(args), "kwargs": kwargs}
            json.dumps(line, allow_nan=False)
        except (TypeError, ValueError) as exc:  # ValueError: NaN, or a circular reference
            raise TypeError("arguments of tool %r must be JSON-serialisable: %s"
                            % (name, exc)) from None
        self.calls += 1
        saved, self.mode = self.mode, DEFER
        try:
            self.send(line)
            while True:
                line = self.readline(interruptible=True)
                if not line:
                    os._exit(0)  # the server is gone
                try:
                    req = self.parse(line)
                except Failure:
                    req = None
                if req and req.get("op") == "tool_result" and req.get("call_id") == call_id:
                    break
                if not (req and req.get("op") == "tool_result"):  # a stale one is dropped
                    self.deferred.append((line, req))
        finally:
            self.mode = saved
        self._raise_missed()  # after the mode switch, so no SIGINT can fall between the two
        error = req.get("error")
        if error is not None:
            if not isinstance(error, dict):
                error = {"message": error}
            raise ToolError(str(error.get("type", "Error")), str(error.get("message", "")))
        return req.get("result")


def main():
    driver = Driver()
    try:
        driver.serve()
    except BaseException:  # a driver bug: say so in the server's log
        if driver.log_fd is not None:
            os.write(driver.log_fd, traceback.format_exc().encode("utf-8", "replace"))
        os._exit(1)


if __name__ == "__main__":
    main()

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
import fcntl
import json
import linecache
import os
import platform
import select
import signal
import sys
import tempfile
import threading
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
                "stderr_truncated": stderr_cut, "value": value, "error": error, "timed_out": False}

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

    OPS = {"exec": op_exec, "put": op_put, "get": op_get, "tools": op_tools}
    OPS.update({
        "process_start": lambda self, req: self.processes.start(self, req),
        "process_read": lambda self, req: self.processes.read(req),
        "process_wait": lambda self, req: self.processes.wait(req),
        "process_kill": lambda self, req: self.processes.kill(req),
    })

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

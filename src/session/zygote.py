# sqbox serve's zygote (docs/serve.md, "The zygote"; the argument in SECURITY.md), run as
# `python3 -c THIS SETTINGS MODULE...` in a sandbox of its own, confined like any payload except
# that its seccomp filter also lets it make namespaces and mounts (security/zygote_seccomp.h). It
# imports the --preload modules once and never runs a request's code itself. It keeps one
# sandbox made ahead, waiting for a request: a child cloned into new user, mount, pid, network,
# ipc, uts and cgroup namespaces that makes its root (a fresh writable layer, /tmp and /dev/shm;
# a procfs of its own), drops every capability and applies Landlock. That child, the sandbox's
# pid 1, forks the process that will run the code, installs the server's seccomp filter on top
# of its own and from then on only reaps. The code's process warms up (runs a request of its
# own, whose output goes nowhere, so that the pages of the zygote it writes are copied before a
# request waits for them) and waits; given a request, it applies it, installs the server's filter
# and runs the code as `python3 -c` would. When the code's process ends, pid 1 writes its wait
# status on a pipe to the zygote (a pid 1 cannot die of a signal to say it: and the code is not
# pid 1, which would ignore signals it sends itself and leave orphans unreaped) and exits, which
# ends everything else in the namespace. Each request takes the sandbox made ahead, and the next
# is made once no request runs (or at once beside other requests).
#
# Descriptor 0 is a SOCK_SEQPACKET socket to the server; each message is a tag byte and text
# (util/fd_passing.h). The server sends "gKEY" with four descriptors (the request in a memfd,
# framed as prestart.py reads it, then the code's stdin, stdout and stderr) and "kKEY" (kill it).
# The zygote sends "wCPU_NS" once ready, then "rKEY WAIT_STATUS CPU_NS MAX_RSS_KIB" as each
# request's sandbox ends. SETTINGS is JSON the server made (session/zygote.cpp). `_enter` and
# `_run` are src/session/python_c.py's, which the server puts before this file.
import atexit
import ctypes
import gc
import io
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from fcntl import ioctl

_settings = json.loads(sys.argv[1])
for _module in sys.argv[2:]:
    __import__(_module)
# What exists now is shared, copy-on-write, by every request's process: kept out of the garbage
# collector's passes, which would write to (and so copy) each object's pages in every request.
gc.freeze()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_DUMPABLE, _PR_SET_SECUREBITS, _PR_CAPBSET_DROP = 4, 28, 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE and the locks of each.
_SECUREBITS_LOCKED = 0xEF
_SYS = _settings["syscalls"]


def _check(result, what):
    if result == -1:
        error = ctypes.get_errno()
        raise OSError(error, "%s: %s" % (what, os.strerror(error)))
    return result


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(source, target, fstype, flags, data), "mount " + target.decode())


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    except OSError as error:
        raise OSError(error.errno, "%s: %s" % (path, os.strerror(error.errno))) from None
    finally:
        os.close(fd)


def _make_root(workdir):
    """In the request's pid 1: a root of its own, as sqbox's sandboxes have, then pivot_root."""
    _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)
    # One tmpfs for everything the request may write (--tmpfs-size), shadowing the zygote's /tmp
    # in this mount namespace only.
    size = b"size=%d,mode=755" % _settings["tmpfs_size"]
    _mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, size)
    for name, mode in (("upper", 0o755), ("work", 0o755), ("root", 0o755), ("tmp", 0o1777),
                       ("shm", 0o1777)):
        os.mkdir("/tmp/" + name)
        os.chmod("/tmp/" + name, mode)
    # The zygote's root (the image, the generated /etc) below, this request's layer above. Its
    # copy without mounts beneath: the kernel takes no lower layer with locked mounts on it.
    _mount(b"overlay", b"/tmp/root", b"overlay", _MS_NOSUID | _MS_NODEV,
           b"lowerdir=%s,upperdir=/tmp/upper,workdir=/tmp/work,userxattr"
           % _settings["lower"].encode())
    _mount(b"proc", b"/tmp/root/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
           b"subset=pid")
    _mount(b"/dev", b"/tmp/root/dev", None, _MS_BIND | _MS_REC)
    _mount(b"devpts", b"/tmp/root/dev/pts", b"devpts", _MS_NOSUID | _MS_NOEXEC,
           b"newinstance,ptmxmode=0666,mode=620")
    _mount(b"/tmp/shm", b"/tmp/root/dev/shm", None, _MS_BIND)
    _mount(b"/tmp/tmp", b"/tmp/root/tmp", None, _MS_BIND)
    os.chdir("/tmp/root")
    _check(_libc.syscall(_SYS["pivot_root"], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "detach the zygote's root")
    os.chdir(workdir)


def _loopback_up():
    flags = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags))  # SIOCSIFFLAGS


def _drop_privileges():
    _check(_libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED, 0, 0, 0), "securebits")
    for capability in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) == -1:
            break  # past the kernel's last capability
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient caps")
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = bytes(24)  # two empty sets of effective, permitted, inheritable
    _check(_libc.syscall(_SYS["capset"], header, data), "capset")


def _landlock():
    rules = _settings["landlock"]
    if not rules:
        return
    attr = struct.pack("QQQ", rules["handled_fs"], 0, rules["scoped"])[: rules["attr_size"]]
    ruleset = _check(_libc.syscall(_SYS["landlock_create_ruleset"], attr, len(attr), 0),
                     "landlock ruleset")
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    beneath = struct.pack("=Qi", rules["allowed_beneath_root"], root)
    _check(_libc.syscall(_SYS["landlock_add_rule"], ruleset, 1, beneath, 0), "landlock rule")
    _check(_libc.syscall(_SYS["landlock_restrict_self"], ruleset, 0), "landlock")
    os.close(root)
    os.close(ruleset)


# The server's filter as the kernel takes it, made once: each request only installs it.
_FILTER = ctypes.create_string_buffer(bytes.fromhex(_settings["filter"]))
_FILTER_PROGRAM = struct.pack("HxxxxxxP", (len(_FILTER) - 1) // 8, ctypes.addressof(_FILTER))


def _seccomp():
    _check(_libc.syscall(_SYS["seccomp"], 1, _settings["filter_flags"], _FILTER_PROGRAM),
           "seccomp")


def _read_request(fd):
    with os.fdopen(fd, "rb") as request:
        header = request.readline()
        code_len, workdir_len, env_len, cpu = header.split()
        code = request.read(int(code_len)).decode("utf-8", "surrogateescape")
        workdir = request.read(int(workdir_len)).decode("utf-8", "surrogateescape")
        env = request.read(int(env_len))
    return code, workdir, env, None if cpu == b"-" else int(cpu)


def _fail(fd, error):
    """One line on the request's stderr: what failed, and in which step."""
    import traceback

    step = traceback.extract_tb(error.__traceback__)[-1].name if error.__traceback__ else "?"
    os.write(fd, b"sqbox: the zygote could not make this request's sandbox (%s): %s\n"
             % (step.strip("_").encode(), str(error).encode()))


# Where a sandbox's pid 1 keeps the write end of its status pipe, and where the sandbox waits for
# its request (its end of a socket pair with the zygote), past the close of the rest.
_REQUEST_FD, _STATUS_FD = 0, 3


def _wait_as_init(code_pid):
    """The sandbox's pid 1 once the code's process exists: reaps whatever ends (orphans of the
    code too) until that process has exited or been killed, hands its wait status to the zygote,
    and exits, never returning. Every signal is blocked (no handler a --preload module set runs
    here); a stop of a code's process that traced itself is not an end."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == code_pid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
                os.write(_STATUS_FD, b"%d" % status)
                break
    finally:
        os._exit(0)


# A request as _read_request reads it, and code shaped like most requests' start.
_WARM_UP_REQUEST = b"%d 0 %d -\n%s%s" % (
    len(b"import sys; print(sys.argv)"), len(b"SQBOX_WARM_UP=1\0"), b"import sys; print(sys.argv)",
    b"SQBOX_WARM_UP=1\0")


def _warm_up():
    """In the code's process, before its request: what every request does first (reading the
    request, entering it, compiling and running code that prints), run once on a request of its
    own whose output goes nowhere. This copy of the zygote writes to the same pages either way;
    warmed up, it has copied them before its request comes instead of while the request waits.
    The request then sets up all of it anew (its __main__, sys.argv, environment, stdio)."""
    read_end, write_end = os.pipe()
    os.write(write_end, _WARM_UP_REQUEST)
    os.close(write_end)
    code, workdir, env, _ = _read_request(read_end)
    stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        _enter(env, workdir)
        _run(code)
    finally:
        sys.stdout = stdout
        del os.environ["SQBOX_WARM_UP"]


def _ready_sandbox(failed, for_request):
    """A sandbox's pid 1: builds the sandbox, forks the process that will run the code, and from
    then on only reaps. That process waits for the request, and only then applies it and the
    server's seccomp filter and runs the code. A step that fails (or `failed`, an error of the
    clone's child) ends a sandbox made ahead at once (the zygote makes the next request one of its
    own), and is said on the request's stderr in one made `for_request`."""
    code_pid = None
    try:
        if failed:
            raise failed
        workdir = os.getcwd()
        _make_root(workdir)
        _loopback_up()
        _drop_privileges()
        _landlock()
        # pid 1 is not dumpable, as sqbox's init: the code cannot trace it or read its memory
        # and descriptors. Set before the fork, so no moment has a dumpable pid 1 beside
        # running code; the code's process takes it back, as `python3 -c` has it.
        _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        code_pid = os.fork()
        if code_pid:
            try:
                os.close(_REQUEST_FD)
                _seccomp()
            except BaseException:
                os._exit(125)  # and the code's process with it, before any request
            _wait_as_init(code_pid)
        os.close(_STATUS_FD)
        _check(_libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        _warm_up()
    except BaseException as error:
        if not for_request:
            os._exit(125)
        failed = error
    request = socket.socket(fileno=_REQUEST_FD)
    _, fds, _, _ = socket.recv_fds(request, 16, 4)
    request.close()
    if len(fds) != 4:
        os._exit(125)  # the zygote ended, or sent nothing to run
    request_fd, stdin, stdout, stderr = fds
    error_fd = stderr
    try:
        if failed:
            raise failed
        code, asked_workdir, env, cpu_seconds = _read_request(request_fd)
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
        error_fd = 2
        for fd in {stdin, stdout, stderr} - {0, 1, 2}:
            os.close(fd)
        _enter(env, asked_workdir)
        if cpu_seconds is not None:
            # As prestart.py sets it: SIGXCPU at N seconds from about now (the warm-up's CPU
            # time counted in whole seconds), SIGKILL a second later.
            used = time.process_time_ns() // 1_000_000_000
            resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_seconds, used + cpu_seconds + 1))
        _seccomp()
    except BaseException as error:
        _fail(error_fd, error)
        os._exit(125)
    if "random" in sys.modules:
        sys.modules["random"].seed()  # the fork hooks did; again, after the preload's draws
    _end(_exit_status_of(code))


def _exit_status_of(code):
    """Runs the code; the status `python3 -c` would exit with, SystemExit handled as the
    interpreter handles it."""
    try:
        _run(code)
        return 0
    except SystemExit as exit:
        if exit.code is None:
            return 0
        if isinstance(exit.code, int):
            # What exit(3) makes of it; one that no C long holds is an error: 255.
            return exit.code & 0xFF if -(1 << 63) <= exit.code < 1 << 63 else 255
        print(exit.code, file=sys.stderr)
        return 1


def _flush(stream):
    """True unless flushing an open stream fails."""
    try:
        if stream is not None and not stream.closed:
            stream.flush()
        return True
    except Exception:  # as for an object destroyed at exit: ignored
        return False


def _end(status):
    """Ends the code's process with what an interpreter's exit does that anyone can see (it waits
    for the code's threads, runs its atexit functions, flushes stdio, closes the files it left
    open), but without tearing the interpreter down: in a copy-on-write child of the zygote, that
    teardown writes to (and so copies) most of the zygote's pages, about twice the cost of the
    code's whole run on a trivial snippet. What is skipped: destructors of objects still alive
    at exit, which nothing outside the sandbox, which ends now, could see but through files;
    those are closed here, as their destruction would close them."""
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    # sys.stdout and sys.stderr as they are now, as Python flushes them (not sys.__stdout__:
    # what a replaced stdout still holds is lost under python3 -c too).
    stdio = [sys.stdout, sys.stderr]
    if not all([_flush(stream) for stream in stdio]):
        status = 120  # as Python ends when it cannot flush stdio at exit
    # Then the files the code left open, as a teardown would close them later. The code's
    # objects only: the zygote's are frozen, out of gc.get_objects()' reach. Text files first,
    # so that what they flush reaches their buffers before those are closed.
    files = [o for o in gc.get_objects() if isinstance(o, io.IOBase)
             and not any(o is stream for stream in stdio)]
    for stream in sorted(files, key=lambda o: not isinstance(o, io.TextIOBase)):
        try:
            stream.close()
        except Exception:  # as for an object destroyed at exit: ignored
            pass
    for stream in stdio:  # what those wrote to stdio on closing (a gzip stream's end)
        _flush(stream)
    os._exit(status)


class _Chosen(BaseException):
    """Raised in a sandbox's pid 1 to leave the zygote's loop (and its frames) behind."""

    def __init__(self, request_end, status_write, failed, for_request):
        super().__init__()
        self.request_end, self.status_write = request_end, status_write
        self.failed, self.for_request = failed, for_request


def _make_sandbox(for_request):
    """Clones a sandbox's pid 1 into new namespaces, to wait there for a request (one that
    waits already, `for_request`, or the next): returns (its pid in the zygote's namespace, the
    socket its request goes to, the read end of its status pipe). Raises OSError if the clone
    fails."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_read, status_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    pids = _settings["pids"]
    if pids:
        # RLIMIT_NPROC counts per user and user namespace: in the new one, this request's
        # processes only, up to what the soft limit was as it was made (the child then lowers
        # its hard limit to that too). Never above what the zygote's sandbox has.
        before = resource.getrlimit(resource.RLIMIT_NPROC)
        if before[1] != resource.RLIM_INFINITY:
            pids = min(pids, before[1])
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, before[1]))
    uid, gid = os.getuid(), os.getgid()  # as the zygote's namespace sees them
    # clone(2) as fork(2) does it (a copy of this process, going on from here), but into new
    # namespaces: one copy of the zygote per request, whose child is pid 1 of its own.
    pid = _libc.syscall(_SYS["clone"], _settings["namespaces"] | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        failed = None
        ours.close()
        os.close(status_read)
        try:
            # A session of its own: kill(0, ...) from the code reaches its own process group,
            # not the zygote's (nor the other sandboxes', which would be in it too).
            os.setsid()
            if pids:
                resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", "%d %d 1" % (uid, uid))
            _write("/proc/self/gid_map", "%d %d 1" % (gid, gid))
        except BaseException as error:
            failed = error
        raise _Chosen(theirs.detach(), status_write, failed, for_request)
    error = ctypes.get_errno()
    if pids:
        resource.setrlimit(resource.RLIMIT_NPROC, before)
    theirs.close()
    os.close(status_write)
    if pid < 0:
        ours.close()
        os.close(status_read)
        raise OSError(error, "clone: " + os.strerror(error))
    return pid, ours, status_read


def _ended_status(status_read, wait_status):
    """The wait status of a request's code, from its pid 1's pipe; without one (killed, or failed
    before the code ran), pid 1's own. Read once pid 1 is gone, so it never waits."""
    try:
        said = os.read(status_read, 32)
    except BlockingIOError:
        said = b""
    os.close(status_read)
    try:
        return int(said) if said else wait_status
    except ValueError:
        return wait_status


def _serve(channel, selector):
    """Answers the server: one sandbox is kept made ahead (`ready`), waiting for its request;
    each request takes it. The next is made once no request runs, so that making it takes no CPU
    from the request (on two vCPUs it did), or at once beside other requests, which would
    otherwise find none; a request that finds none gets one made for it."""
    selector.register(channel, selectors.EVENT_READ)
    running = {}  # pidfd -> (key or None while it waits for a request, pid, status read end)
    by_key = {}  # key -> pid
    ready = None  # (pidfd, socket) of the sandbox made ahead

    def requests_running():
        return sum(1 for key, _, _ in running.values() if key is not None)

    def make_ready(for_request=False):
        pid, request, status_read = _make_sandbox(for_request)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(status_read)
            request.close()
            raise
        selector.register(pidfd, selectors.EVENT_READ)
        running[pidfd] = (None, pid, status_read)
        return pidfd, request

    try:
        ready = make_ready()
    except OSError:
        ready = None  # made when a request comes, and its error said there
    channel.send(b"w%d" % time.process_time_ns())
    while True:
        for item, _ in selector.select():
            if item.fileobj is channel:
                message, fds, _, _ = socket.recv_fds(channel, 256, 4)
                if not message:
                    return
                verb, key = message[:1], message[1:]
                if verb == b"k":
                    if key in by_key:
                        os.kill(by_key[key], signal.SIGKILL)
                    continue
                if len(fds) != 4:
                    for fd in fds:
                        os.close(fd)
                    channel.send(b"r%s %d 0 0" % (key, 125 << 8))
                    continue
                step = b"clone"
                try:
                    if ready is None:
                        ready = make_ready(for_request=True)
                    (pidfd, request), ready = ready, None
                    step = b"hand-over"
                    with request:
                        socket.send_fds(request, [b"g"], fds)
                    _, pid, status_read = running[pidfd]
                    running[pidfd] = (key, pid, status_read)
                    by_key[key] = pid
                except OSError as error:
                    # A sandbox whose hand-over failed ends for want of a request, its pidfd
                    # says when.
                    try:
                        os.write(fds[3], b"sqbox: the zygote could not make this request's "
                                 b"sandbox (%s): %s\n" % (step, str(error).encode()))
                    except OSError:
                        pass  # its reader is gone
                    channel.send(b"r%s %d 0 0" % (key, 125 << 8))
                for fd in fds:
                    os.close(fd)
                # Beside other requests, or after a hand-over that failed (no request runs),
                # the next is made now; after a hand-over to a request alone, once it ends.
                if ready is None and requests_running() != 1:
                    try:
                        ready = make_ready()
                    except OSError:
                        pass  # made when the next request comes
            else:
                pidfd = item.fileobj
                key, pid, status_read = running.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status, usage = os.wait4(pid, 0)
                status = _ended_status(status_read, status)
                if key is None:
                    # Ended before any request (killed, or its hand-over failed): the next
                    # request gets one made for it.
                    if ready is not None and ready[0] == pidfd:
                        ready[1].close()
                        ready = None
                    continue
                del by_key[key]
                cpu_ns = int((usage.ru_utime + usage.ru_stime) * 1e9)
                channel.send(b"r%s %d %d %d" % (key, status, cpu_ns, usage.ru_maxrss))
                if ready is None and requests_running() == 0:
                    try:
                        ready = make_ready()
                    except OSError:
                        pass  # made when the next request comes


_chosen = None
_channel = socket.socket(fileno=0)
_selector = selectors.DefaultSelector()
try:
    _serve(_channel, _selector)
except _Chosen as chosen:
    # Their descriptors are closed here and now, never by a collector once the sandbox's own
    # descriptors may have the same numbers.
    _selector.close()
    _channel.detach()
    # This is a sandbox's pid 1: what follows runs outside the handler, and without the frames
    # of the zygote's loop (its bookkeeping of other requests).
    chosen.__traceback__ = None
    _chosen = chosen
if _chosen:
    os.dup2(_chosen.request_end, _REQUEST_FD)  # in place of the channel to the server
    os.dup2(_chosen.status_write, _STATUS_FD)
    os.closerange(_STATUS_FD + 1, 1 << 16)
    _ready_sandbox(_chosen.failed, _chosen.for_request)

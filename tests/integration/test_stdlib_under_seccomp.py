"""Ordinary Python programs keep working under the seccomp profiles: the default profile (no
--seccomp option) must not break the standard library, and `--seccomp strict` allows all of it
but IP networking."""
import json

import pytest

CHECKS = r'''
import asyncio
import concurrent.futures
import errno
import json
import mmap
import multiprocessing
import os
import selectors
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib


def square(x):
    return x * x


def put_pid(queue):
    queue.put(os.getpid())


def check_subprocess():
    done = subprocess.run(["sh", "-c", "echo out; echo err >&2; exit 3"], capture_output=True,
                          text=True, timeout=20)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n"), done
    assert subprocess.check_output([sys.executable, "-c", "print(6 * 7)"], timeout=20) == b"42\n"
    with subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.communicate(b"piped", timeout=20)[0] == b"piped"
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 5"], os.environ)
    assert os.waitpid(pid, 0)[1] == 5 << 8


def check_threads():
    counter = [0]
    lock = threading.Lock()
    def work():
        for _ in range(1000):
            with lock:
                counter[0] += 1
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 8000
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(square, range(10))) == [x * x for x in range(10)]
    event, barrier = threading.Event(), threading.Barrier(3)
    def wait_all():
        barrier.wait(timeout=10)
        event.wait(timeout=10)
    waiters = [threading.Thread(target=wait_all) for _ in range(2)]
    for t in waiters:
        t.start()
    barrier.wait(timeout=10)
    event.set()
    for t in waiters:
        t.join()


def check_multiprocessing(method):
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
    queue = ctx.Queue()
    proc = ctx.Process(target=put_pid, args=(queue,))
    proc.start()
    child = queue.get(timeout=20)
    proc.join(20)
    assert proc.exitcode == 0 and child != os.getpid()
    lock, value = ctx.Lock(), ctx.Value("i", 0)  # POSIX semaphores in /dev/shm
    with lock:
        value.value += 1
    assert value.value == 1
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        assert sum(pool.map(square, range(5))) == 30


def check_multiprocessing_fork():
    check_multiprocessing("fork")


def check_multiprocessing_spawn():
    check_multiprocessing("spawn")


def check_multiprocessing_manager():
    with multiprocessing.get_context("fork").Manager() as manager:  # an AF_UNIX server
        shared = manager.dict()
        shared["k"] = 1
        assert dict(shared) == {"k": 1}


async def _echo(reader, writer):
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()


async def _asyncio_main(use_tcp):
    if use_tcp:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
    else:
        path = tempfile.mktemp(suffix=".sock")
        server = await asyncio.start_unix_server(_echo, path)
        reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"hello loop\n")
    await writer.drain()
    assert await reader.readline() == b"hello loop\n"
    writer.close()
    server.close()
    await server.wait_closed()
    results = await asyncio.gather(asyncio.sleep(0.01, result=1), asyncio.sleep(0.02, result=2))
    assert results == [1, 2]
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, square, 7) == 49
    proc = await asyncio.create_subprocess_exec("echo", "async", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out == b"async\n" and proc.returncode == 0
    try:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.05)
    except asyncio.TimeoutError:
        pass
    else:
        raise AssertionError("wait_for did not time out")


def check_asyncio_tcp():
    asyncio.run(_asyncio_main(use_tcp=True))


def check_asyncio_unix():
    asyncio.run(_asyncio_main(use_tcp=False))


def check_tcp():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=5)
    conn, _ = server.accept()
    client.sendall(b"tcp data")
    assert conn.recv(100) == b"tcp data"
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for s in (client, conn, server):
        s.close()


def check_udp():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.sendto(b"datagram", a.getsockname())
    data, _ = a.recvfrom(100)
    assert data == b"datagram"


def check_tcp_refused():
    for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                         (socket.AF_INET6, socket.SOCK_STREAM)):
        try:
            socket.socket(family, kind).close()
        except OSError as e:
            assert e.errno in (errno.EPERM, errno.EACCES, errno.EAFNOSUPPORT), e
        else:
            raise AssertionError(f"socket({family}, {kind}) was allowed")


def check_unix_sockets():
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    conn, _ = server.accept()
    client.sendall(b"unix")
    assert conn.recv(10) == b"unix"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind("\0sqbox-stdlib-check")
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"abs", "\0sqbox-stdlib-check")
    assert abstract.recv(10) == b"abs"
    left, right = socket.socketpair()
    left.sendall(b"pair")
    assert right.recv(10) == b"pair"
    r, w = os.pipe()  # passing a descriptor over a unix socket
    socket.send_fds(left, [b"fd"], [w])
    msg, fds, _, _ = socket.recv_fds(right, 10, 1)
    os.write(fds[0], b"via fd")
    assert os.read(r, 10) == b"via fd"


def check_mmap():
    anonymous = mmap.mmap(-1, 1 << 20)
    anonymous[:5] = b"hello"
    assert anonymous[:5] == b"hello"
    with tempfile.TemporaryFile() as f:
        f.write(b"\0" * 4096)
        f.flush()
        mapped = mmap.mmap(f.fileno(), 4096)
        mapped[:4] = b"file"
        mapped.flush()
        f.seek(0)
        assert f.read(4) == b"file"
    shared = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)
    pid = os.fork()
    if pid == 0:
        shared[:5] = b"child"
        os._exit(0)
    os.waitpid(pid, 0)
    assert shared[:5] == b"child"
    fd = os.memfd_create("check")
    os.write(fd, b"memfd")
    assert os.pread(fd, 5, 0) == b"memfd"


def check_tempfile():
    with tempfile.NamedTemporaryFile("w+") as f:
        f.write("named")
        f.flush()
        assert open(f.name).read() == "named"
    with tempfile.TemporaryDirectory() as d:
        fd, path = tempfile.mkstemp(dir=d)
        os.write(fd, b"x")
        os.close(fd)
        assert os.path.getsize(path) == 1
        os.rename(path, path + ".renamed")
        os.symlink(path + ".renamed", path + ".link")
        assert os.readlink(path + ".link") == path + ".renamed"
    with tempfile.SpooledTemporaryFile(max_size=10) as f:
        f.write(b"spooled beyond ten bytes")
        f.seek(0)
        assert f.read().startswith(b"spooled")


def check_signals():
    received = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.01)
    assert received == [signal.SIGUSR1], received
    signal.signal(signal.SIGUSR1, old)
    fired = []
    signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(time.monotonic()))
    start = time.monotonic()
    signal.alarm(1)
    while not fired and time.monotonic() - start < 5:
        time.sleep(0.02)
    assert fired and 0.5 < fired[0] - start < 3, (fired, start)
    fired.clear()
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    while not fired and time.monotonic() - start < 10:
        time.sleep(0.01)
    assert fired
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    os.kill(os.getpid(), signal.SIGUSR2)
    assert signal.sigwait([signal.SIGUSR2]) == signal.SIGUSR2
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])


def check_fork():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os._exit(7)
    os.close(w)
    child = int(os.read(r, 20))
    waited, status, usage = os.wait4(pid, 0)
    assert waited == pid == child and os.waitstatus_to_exitcode(status) == 7
    assert usage.ru_maxrss > 0
    pidfd = os.pidfd_open(os.getpid())
    os.close(pidfd)


def check_select_poll_epoll():
    r, w = os.pipe()
    assert select.select([r], [], [], 0) == ([], [], [])
    os.write(w, b"x")
    assert select.select([r], [], [], 1)[0] == [r]
    poller = select.poll()
    poller.register(r, select.POLLIN)
    assert poller.poll(1000) == [(r, select.POLLIN)]
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)
    assert ep.poll(1) == [(r, select.EPOLLIN)]
    ep.close()
    with selectors.DefaultSelector() as sel:
        sel.register(r, selectors.EVENT_READ)
        assert len(sel.select(1)) == 1
    efd = os.eventfd(0)
    os.eventfd_write(efd, 3)
    assert os.eventfd_read(efd) == 3


def check_time():
    t0, m0, p0 = time.time(), time.monotonic(), time.perf_counter()
    time.sleep(0.05)
    assert time.monotonic() - m0 >= 0.049 and time.perf_counter() - p0 >= 0.049
    assert abs(time.time() - t0 - 0.05) < 1
    for clock in (time.CLOCK_REALTIME, time.CLOCK_MONOTONIC, time.CLOCK_BOOTTIME,
                  time.CLOCK_PROCESS_CPUTIME_ID, time.CLOCK_THREAD_CPUTIME_ID,
                  time.CLOCK_MONOTONIC_RAW):
        assert time.clock_gettime(clock) >= 0
        assert time.clock_getres(clock) > 0
    assert time.process_time() >= 0 and time.thread_time() >= 0
    assert time.strftime("%Y", time.localtime()) >= "2024"
    assert time.gmtime(0).tm_year == 1970


def check_files_and_misc():
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "a"), os.path.join(d, "b")
        with open(src, "wb") as f:
            f.write(os.urandom(100000))
        import fcntl
        import shutil
        with open(src, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.lockf(f, fcntl.LOCK_UN)
        shutil.copyfile(src, dst)  # sendfile / copy_file_range
        assert open(src, "rb").read() == open(dst, "rb").read()
        db = sqlite3.connect(os.path.join(d, "db.sqlite"))
        db.execute("create table t (x)")
        db.executemany("insert into t values (?)", [(i,) for i in range(100)])
        db.commit()
        assert db.execute("select sum(x) from t").fetchone() == (4950,)
        db.close()
        os.statvfs(d)
    assert zlib.decompress(zlib.compress(b"data" * 100)) == b"data" * 100
    assert len(os.getrandom(16)) == 16 and len(os.urandom(16)) == 16
    assert os.cpu_count() >= 1 and os.sched_getaffinity(0)
    os.sched_yield()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    os.nice(1)
    import ctypes
    libc = ctypes.CDLL(None)
    assert libc.getpid() == os.getpid()


COMMON = [check_subprocess, check_threads, check_multiprocessing_fork,
          check_multiprocessing_spawn, check_multiprocessing_manager, check_asyncio_unix,
          check_unix_sockets, check_mmap, check_tempfile, check_signals, check_fork,
          check_select_poll_epoll, check_time, check_files_and_misc]
MODES = {"default": COMMON + [check_asyncio_tcp, check_tcp, check_udp],
         "strict": COMMON + [check_tcp_refused]}

if __name__ == "__main__":
    results = {}
    for check in MODES[sys.argv[1]]:
        try:
            check()
            results[check.__name__] = "ok"
        except BaseException:
            results[check.__name__] = traceback.format_exc()
    print(json.dumps(results), flush=True)
'''


@pytest.fixture
def check_dir(tmp_path):
    directory = tmp_path / "stdlib-check"
    directory.mkdir()
    (directory / "stdlib_check.py").write_text(CHECKS)
    directory.chmod(0o755)
    return directory


def _run_checks(sqbox, python_image, check_dir, mode, options):
    result = sqbox.run(python_image, "python3", "/check/stdlib_check.py", mode,
                       options=["--mount", f"{check_dir}:/check:ro", "--timeout", "120",
                                *options], timeout=180)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.splitlines()[-1])
    failures = {name: outcome for name, outcome in results.items() if outcome != "ok"}
    assert failures == {}, "\n".join(f"{name}:\n{tb}" for name, tb in failures.items())
    return results


def test_stdlib_works_under_the_default_profile(sqbox, python_image, check_dir):
    results = _run_checks(sqbox, python_image, check_dir, "default", [])
    assert len(results) == 17
    # The profile really is in force (the checks above would pass without one too).
    status = sqbox.run(python_image, "cat", "/proc/self/status").stdout
    assert "Seccomp:\t2" in status


def test_stdlib_works_under_the_strict_profile_except_ip(sqbox, python_image, check_dir):
    results = _run_checks(sqbox, python_image, check_dir, "strict", ["--seccomp", "strict"])
    assert len(results) == 15
    assert results["check_tcp_refused"] == "ok"

# sqbox serve's pre-started interpreter (docs/serve.md, "Pre-started interpreters"), run as
# `python3 -c THIS MODULE...` in a sandbox of its own, already confined (seccomp, Landlock, no
# privileges) like any payload. It imports the configured modules, says so on stdout, and waits
# for the one request this sandbox will ever serve; then it runs that code as `python3 -c` would
# and the interpreter exits with it. No code of a request runs before the modules are imported,
# and the sandbox is never used again.
#
# The request on stdin, read with os.read so that what follows stays unread on descriptor 0 for
# the code (its stdin): one header line of decimal fields "CODE_LEN WORKDIR_LEN ENV_LEN CPU\n"
# (CPU the cpu_time limit in seconds, or "-"), then CODE_LEN bytes of code, WORKDIR_LEN bytes of
# working directory (none: stay where the sandbox started), and ENV_LEN bytes of "KEY=VALUE\0"
# additions to the environment. Nothing beyond what `python3 -c pass` loads is imported here.
# `_enter` and `_run` are src/session/python_c.py's, which the server puts before this file.
import os
import sys
import time

_module = None

for _module in sys.argv[1:]:
    __import__(_module)

# The server strips this line from the output and takes the CPU time spent so far off the run's.
os.write(1, b"sqbox-prestart-ready %d\n" % time.process_time_ns())


def _read_exactly(size):
    data = bytearray()
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            os._exit(0)  # the server discarded this sandbox before using it
        data += chunk
    return bytes(data)


def _request():
    header = bytearray()
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 80:
            os._exit(0)
        header += byte
    code_len, workdir_len, env_len, cpu = header.split()
    code = _read_exactly(int(code_len)).decode("utf-8", "surrogateescape")
    workdir = _read_exactly(int(workdir_len)).decode("utf-8", "surrogateescape")
    env = _read_exactly(int(env_len))
    return code, workdir, env, None if cpu == b"-" else int(cpu)


def _prepare(workdir, env, cpu_seconds):
    _enter(env, workdir)
    if cpu_seconds is not None:
        # What `sqbox run --cpu-time N` sets, counted from about now: RLIMIT_CPU counts the
        # process's whole life, and the start and the imports have used some already (whole
        # seconds of it are added; the fraction, tens of milliseconds, is the code's less).
        import resource

        used = time.process_time_ns() // 1_000_000_000
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_seconds, used + cpu_seconds + 1))
    # Each sandbox's interpreter seeded itself from the kernel when it started, so no two share
    # a state; seeding again at the request also keeps the preload's draws (if any) from telling
    # anything about the request's.
    if "random" in sys.modules:
        sys.modules["random"].seed()


_code, _workdir, _env, _cpu = _request()
_prepare(_workdir, _env, _cpu)
del _request, _prepare, _read_exactly, _workdir, _env, _cpu, _module
_run(_code)

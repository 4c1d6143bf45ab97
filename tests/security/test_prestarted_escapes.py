"""Escape attempts from a pre-started sandbox (`sqbox serve --prestart N`) and from one a zygote
made (`sqbox serve --zygote`): the interpreter ran its start-up and imports before the request
came, but the request's code meets the same walls as in a fresh `sqbox run`. Attacks of the other
modules of this suite run again, unchanged, through `run_python` requests; and a request cannot
reach the pre-started sandboxes still waiting for theirs, nor the zygote and its other requests.
"""
import json
import os
import subprocess
import textwrap
import time
import uuid

import pytest

import test_processes
import test_syscalls
from conftest import Box
from escape_support import PRELUDE, SANDBOX_TIMEOUT
from test_serve import LIST_FDS, Server


class PrestartedBox(Box):
    """Runs the suite's Python attacks as run_python requests of one server's pre-started
    interpreters; every answer must say a pre-started interpreter served it."""

    def __init__(self, box, server):
        super().__init__(box.binary, box.python_image, box.busybox_image, box.marker,
                         lambda: box.attacks_dir)
        self.server = server

    def py(self, script, *args, options=(), helpers="", **kwargs):
        assert not options and not kwargs, "a pre-started sandbox takes no options"
        argv = [self.marker, *[str(a) for a in args]]
        source = (f"import sys\nsys.argv[1:] = {argv!r}\n" + PRELUDE +
                  textwrap.dedent(helpers) + textwrap.dedent(script))
        answer = self.server.call({"id": uuid.uuid4().hex, "op": "run_python", "code": source,
                                   "timeout": SANDBOX_TIMEOUT})
        assert answer.get("prestarted") is True, answer
        return subprocess.CompletedProcess([], answer["exit_code"], answer["stdout"],
                                           answer["stderr"])


WAYS = {"prestart": ["--prestart", "2"], "zygote": ["--zygote"]}
ZYGOTE_NEEDS_A_USER = pytest.mark.skipif(
    os.geteuid() == 0, reason="--zygote: the kernel lets no process without CAP_SETFCAP map "
    "uid 0 into a user namespace of its own; tested as a plain user")


def _served(box, way):
    server = Server(box.binary, box.python_image, *WAYS[way], "--preload", "json,ctypes")
    prestarted = PrestartedBox(box, server)
    prestarted.way = way
    return prestarted


@pytest.fixture(params=["prestart", pytest.param("zygote", marks=ZYGOTE_NEEDS_A_USER)])
def prestarted_box(box, request):
    prestarted = _served(box, request.param)
    yield prestarted
    prestarted.server.close()


@pytest.fixture
def zygote_box(box):
    prestarted = _served(box, "zygote")
    yield prestarted
    prestarted.server.close()


ATTACKS = [
    test_syscalls.test_nested_user_namespace_via_unshare,
    test_syscalls.test_mount_api_chroot_pivot_root_and_setns_are_refused,
    test_syscalls.test_forbidden_syscalls_through_syscall2,
    test_syscalls.test_io_uring_is_refused,
    test_syscalls.test_keyring_syscalls_are_refused,
    test_syscalls.test_bpf_is_refused,
    test_processes.test_init_cannot_be_traced_or_plundered,
]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.__name__[5:] for a in ATTACKS])
def test_attacks_fail_the_same_from_a_prestarted_sandbox(prestarted_box, attack):
    # Under the zygote, "init" is the request's pid 1: the zygote's copy that made the sandbox
    # and now waits for the code's process.
    attack(prestarted_box)


@pytest.mark.parametrize("attack", [test_processes.test_host_processes_are_invisible,
                                    test_processes.test_host_processes_cannot_be_signalled,
                                    test_processes.test_host_processes_cannot_be_traced],
                         ids=["invisible", "signal", "trace"])
def test_host_processes_are_out_of_reach_of_a_prestarted_sandbox(prestarted_box, host_sleeper,
                                                                  attack):
    attack(prestarted_box, host_sleeper)


def test_a_prestarted_payload_holds_only_stdio(prestarted_box):
    answer = prestarted_box.server.call({"id": "fds", "op": "run_python", "code": LIST_FDS})
    assert answer["prestarted"] is True and answer["exit_code"] == 0, answer
    assert answer["stdout"] == "[0, 1, 2, 3]\n"


def test_a_request_cannot_reach_the_interpreters_waiting_in_the_pool(prestarted_box):
    """Two interpreters wait, started and idle, while the request runs (or the zygote waits for
    the next request): it sees no process but its own and its init (under the zygote: its pid 1),
    cannot signal or trace anything outside, and those that waited serve the next requests
    unharmed."""
    time.sleep(2)  # the pool is full and idle
    _, res = prestarted_box.py_results("""
        import signal
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        killed = 0
        for pid in range(2, 4096):
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        attempt("kill_minus_one", os.kill, -1, signal.SIGKILL)
        finish(pids=pids, me=os.getpid(), killed=killed)
    """)
    assert res["pids"] == sorted({1, res["me"]}), res
    assert res["killed"] == 0, res
    for i in range(3):
        answer = prestarted_box.server.call({"id": f"after-{i}", "op": "run_python",
                                             "code": "print('alive')"})
        assert answer["prestarted"] is True and answer["stdout"] == "alive\n", answer


def test_code_cannot_answer_for_another_request(prestarted_box):
    """A pre-started interpreter's stdout is its own request's output only: text shaped like
    the ready line or like a protocol answer stays output of that request."""
    server = prestarted_box.server
    forged = json.dumps({"id": "victim", "ok": True, "exit_code": 0, "stdout": "forged"})
    answer = server.call({"id": "forger", "op": "run_python",
                          "code": f"print('sqbox-prestart-ready 1'); print({forged!r})"})
    assert answer["stdout"] == f"sqbox-prestart-ready 1\n{forged}\n", answer
    victim = server.call({"id": "victim", "op": "run_python", "code": "print('real')"})
    assert victim["stdout"] == "real\n", victim


@ZYGOTE_NEEDS_A_USER
def test_a_zygote_request_holds_no_capability_and_none_of_the_zygote_root(zygote_box):
    """The child that made the request's sandbox had every capability over its namespaces; the
    code gets none, and the mount-free copy of the zygote's root it was made from shows empty."""
    _, res = zygote_box.py_results("""
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        finish(caps={k: status[k].strip() for k in status if k.startswith("Cap")},
               nnp=status["NoNewPrivs"].strip(), filters=status["Seccomp_filters"].strip(),
               lower=os.listdir("/.sqbox-zygote-lower"))
    """)
    assert set(res["caps"].values()) == {"0000000000000000"}, res
    assert res["nnp"] == "1" and res["filters"] == "2", res
    assert res["lower"] == [], res

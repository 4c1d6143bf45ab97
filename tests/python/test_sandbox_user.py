"""The sandbox user exists for every way in: `sqbox run`, `sqbox serve` run requests and
sessions, and the enroot front end. Programs that look their user up find the caller's name,
uid and gid, a home that exists and is writable, and USER, LOGNAME and HOME set."""
import json
import os
import pwd
import subprocess

import pytest

PROBE = """
import getpass, grp, json, os, pathlib, pwd
entry = pwd.getpwuid(os.getuid())
home = pathlib.Path.home()
try:
    (home / ".probe").write_text("written")
    writable = True
except OSError:
    writable = False
print(json.dumps({"name": entry.pw_name, "uid": entry.pw_uid, "gid": entry.pw_gid,
                  "home": entry.pw_dir, "shell": entry.pw_shell,
                  "group": grp.getgrgid(os.getgid()).gr_name, "getuser": getpass.getuser(),
                  "expanduser": os.path.expanduser("~"), "path_home": str(home),
                  "home_is_dir": home.is_dir(), "home_writable": writable,
                  "env": [os.environ.get(k) for k in ("USER", "LOGNAME", "HOME")]}))
"""


def expected_user(root=False):
    if root or os.geteuid() == 0:
        return {"name": "root", "uid": 0, "gid": 0, "home": "/root", "group": "root"}
    return {"name": pwd.getpwuid(os.geteuid()).pw_name, "uid": os.geteuid(),
            "gid": os.getegid(), "home": "/tmp", "group": None}


def check(probe, root=False, read_only_root=False):
    """read_only_root: enroot's start without --rw, where root's /root is read-only (as under
    enroot); the plain user's home, /tmp, is writable always."""
    expected = expected_user(root)
    assert probe["home_is_dir"], probe
    assert probe["home_writable"] or (read_only_root and expected["name"] == "root"), probe
    assert probe["name"] == expected["name"] and probe["getuser"] == expected["name"], probe
    assert (probe["uid"], probe["gid"]) == (expected["uid"], expected["gid"]), probe
    assert probe["home"] == probe["path_home"] == probe["expanduser"] == expected["home"], probe
    assert probe["env"] == [expected["name"], expected["name"], expected["home"]], probe
    assert probe["shell"] == "/bin/sh" or root or os.geteuid() == 0, probe
    if expected["group"]:
        assert probe["group"] == expected["group"], probe


@pytest.mark.parametrize("root", [False, True])
def test_sqbox_run(sqbox_bin, python_image, root):
    options = ["--root"] if root else []
    result = subprocess.run([sqbox_bin, "run", *options, python_image, "--", "python3", "-c",
                             PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    check(json.loads(result.stdout), root)


def test_serve_run_request_and_session(sandbox):
    result = sandbox.run(["python3", "-c", PROBE], timeout=30)
    assert result.exit_code == 0, result.stderr
    check(json.loads(result.stdout))
    with sandbox.session(timeout=30) as session:
        executed = session.execute(PROBE)
        assert executed.ok, executed
        check(json.loads(executed.stdout))


@pytest.mark.parametrize("root", [False, True])
def test_enroot_start(sqbox_bin, python_image, tmp_path, root):
    env = dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data"))
    options = ["--root"] if root else []
    result = subprocess.run([sqbox_bin, "enroot", "start", *options, python_image, "python3",
                             "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    check(json.loads(result.stdout), root, read_only_root=True)

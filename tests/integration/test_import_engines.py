"""enroot's dockerd:// and podman:// sources, against a real engine: Debian's podman, started
here as `podman system service` on a socket of its own with its own storage (vfs, no network),
holding an image loaded from a docker-archive built with umoci and skopeo. sqbox speaks the Docker
Engine API to that socket (podman's is Docker-compatible, so dockerd:// is tested against it too
through DOCKER_HOST). The results must be the docker-archive import of the same image, entry by
entry.

A real engine cannot be made to answer with garbage, so the hostile answers (an endless archive,
a decompression bomb, an error with several lines) come from a small fake engine on a unix socket
written here.
"""
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from test_import import (IS_ROOT, need, run, tree_of, unpack_squashfs, write_base_rootfs,
                         zstd_tar_of_zeros)

IMAGE = "sqbox-test/engine:v1"


def one_line_failure(result, expected):
    assert result.returncode == 125, result.stderr
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def import_command(sqbox_bin, uri, output, env, **kwargs):
    return subprocess.run([sqbox_bin, "import", uri, "-o", str(output)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                          **kwargs)


class PodmanService:
    """`podman system service` on a socket below `work`, storage and configuration there too."""

    def __init__(self, work: Path):
        self.work = work
        self.socket = work / "podman.sock"
        run_dir = work / "run"
        run_dir.mkdir(mode=0o700)
        self.env = dict(os.environ, HOME=str(work), XDG_RUNTIME_DIR=str(run_dir),
                        XDG_CONFIG_HOME=str(work / "config"), XDG_DATA_HOME=str(work / "data"))
        # Rootless podman takes a run root of at most 50 characters: a short one in /tmp.
        self.runroot = Path(tempfile.mkdtemp(prefix="sqbox-podman-", dir="/tmp"))
        self.options = ["--root", str(work / "storage"), "--runroot", str(self.runroot),
                        "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
                        "--events-backend", "file", "--tmpdir", str(work / "tmp")]
        self.process = None

    def podman(self, *args):
        return subprocess.run(["podman", *self.options, *args], env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=120)

    def start(self):
        self.log = open(self.work / "service.log", "w")
        self.process = subprocess.Popen(
            ["podman", *self.options, "system", "service", "--time=0", f"unix://{self.socket}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.socket.exists():
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.log.close()
        # The storage below `work` holds files of the user namespace's other ids: podman's own
        # user namespace removes them.
        if not IS_ROOT:
            self.podman("unshare", "rm", "-rf", str(self.work / "storage"), str(self.runroot))
        # Rootless podman leaves its user namespace's pause process behind: ours, so ended here.
        pause = self.work / "tmp" / "pause.pid"
        if pause.exists():
            try:
                os.kill(int(pause.read_text().strip()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(self.work / "storage", ignore_errors=True)
        shutil.rmtree(self.runroot, ignore_errors=True)


@pytest.fixture(scope="module")
def engine_image(tmp_path_factory):
    """A docker-archive of two layers (busybox and the base tree of test_import: hard links, a
    setuid file, xattrs, symlinks; then whiteouts and a replaced file) with an entrypoint,
    environment and working directory, built with umoci and skopeo."""
    need("umoci", "umoci")
    need("skopeo", "skopeo")
    work = tmp_path_factory.mktemp("engine-image")
    layout = work / "layout"
    rootless = [] if IS_ROOT else ["--rootless"]
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:v1"])
    bundle = work / "bundle"
    run(["umoci", "unpack", *rootless, "--image", f"{layout}:v1", str(bundle)])
    rootfs = bundle / "rootfs"
    write_base_rootfs(rootfs)
    run(["umoci", "repack", "--image", f"{layout}:v1", str(bundle)])
    (rootfs / "data/gone").unlink()
    (rootfs / "data/replaced").unlink()
    (rootfs / "data/replaced").write_text("new content\n")
    (rootfs / "layer-two").write_text("2\n")
    run(["umoci", "repack", "--image", f"{layout}:v1", str(bundle)])
    run(["umoci", "config", "--image", f"{layout}:v1", "--config.entrypoint", "/bin/sh",
         "--config.cmd", "-c", "--config.cmd", "echo engine; cat /etc/greeting /layer-two",
         "--config.env", "FROM_ENGINE=yes", "--config.env", "PATH=/bin",
         "--config.workingdir", "/work"])
    archive = work / "image.tar"
    run(["skopeo", "copy", "--quiet", f"oci:{layout}:v1", f"docker-archive:{archive}:{IMAGE}"])
    archive.chmod(0o644)
    return archive


@pytest.fixture(scope="module")
def podman(engine_image, tmp_path_factory):
    need("podman", "podman")
    service = PodmanService(tmp_path_factory.mktemp("podman"))
    loaded = service.podman("load", "-i", str(engine_image))
    if loaded.returncode != 0:
        pytest.skip(f"podman (Debian package podman) cannot load an image here: "
                    f"{loaded.stderr.strip()[-300:]}")
    try:
        if not service.start():
            pytest.skip("podman (Debian package podman) cannot start its API service here: "
                        + (service.work / "service.log").read_text()[-300:])
        yield service
    finally:
        service.stop()


def sqbox_env(podman, **extra):
    env = dict(os.environ, CONTAINER_HOST=f"unix://{podman.socket}",
               DOCKER_HOST=f"unix://{podman.socket}", SOURCE_DATE_EPOCH="1700000000")
    env.update(extra)
    return env


def unpacked_tree(image: Path, scratch: Path):
    """The image's entries; /etc/rc without its provenance line (the URI differs)."""
    directory = scratch / f"unpacked-{image.name}"
    unpack_squashfs(image, directory)
    tree, links = tree_of(directory, owners=IS_ROOT)
    rc = (directory / "etc/rc").read_text().split("\n", 1)
    tree.pop("etc/rc")
    return tree, links, rc


def test_podman_and_dockerd_imports_equal_the_archives(podman, engine_image, sqbox_bin, sqbox,
                                                       tmp_path):
    env = sqbox_env(podman)
    reference = tmp_path / "reference.sqsh"
    run([sqbox_bin, "import", f"docker-archive:{engine_image}", "-o", str(reference)], env=env)
    want_tree, want_links, want_rc = unpacked_tree(reference, tmp_path)
    assert want_tree["data/replaced"]["sha"] == hashlib.sha256(b"new content\n").hexdigest()
    assert "data/gone" not in want_tree and want_links  # the image has what is compared

    out = tmp_path / "out"
    out.mkdir()
    run([sqbox_bin, "import", f"podman://{IMAGE}", "-o", str(out / "podman.sqsh")], env=env)
    run([sqbox_bin, "import", f"dockerd://{IMAGE}", "-o", str(out / "dockerd.sqsh")], env=env)
    # enroot's front end, naming the file as enroot does.
    run([sqbox_bin, "enroot", "import", f"podman://{IMAGE}"], env=env, cwd=out)
    assert sorted(os.listdir(out)) == ["dockerd.sqsh", "podman.sqsh",
                                       "sqbox-test+engine+v1.sqsh"]  # no scratch left
    for name, uri in (("podman.sqsh", f"podman://{IMAGE}"), ("dockerd.sqsh", f"dockerd://{IMAGE}"),
                      ("sqbox-test+engine+v1.sqsh", f"podman://{IMAGE}")):
        tree, links, rc = unpacked_tree(out / name, tmp_path)
        assert tree == want_tree, name
        assert links == want_links, name
        assert rc == [f"# enroot-provenance: {uri}", want_rc[1]], name

    digests = {run([sqbox_bin, "enroot", "digest", uri], env=env).stdout.strip()
               for uri in (f"podman://{IMAGE}", f"dockerd://{IMAGE}",
                           f"docker-archive:{engine_image}")}
    assert len(digests) == 1 and digests.pop().startswith("sha256:")

    # The imported image runs as enroot would run it.
    result = subprocess.run([sqbox_bin, "enroot", "start", str(out / "podman.sqsh")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "engine\nhello from layer one\n2\n"
    result = sqbox.run(str(out / "dockerd.sqsh"), "/bin/sh", "-c",
                       "cat /data/replaced; test -e /data/gone || echo gone", env=env)
    assert result.stdout == "new content\ngone\n", result.stderr


def test_podman_errors_are_one_line_and_leave_nothing(podman, sqbox_bin, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = sqbox_env(podman)
    result = import_command(sqbox_bin, "podman://sqbox-test/absent:v9", out / "x.sqsh", env)
    one_line_failure(result, "image not found: sqbox-test/absent:v9 (the podman service at "
                     f"{podman.socket}: ")
    result = import_command(sqbox_bin, "dockerd://sqbox-test/absent", out / "x.sqsh", env)
    one_line_failure(result, "image not found: sqbox-test/absent (the Docker daemon at ")
    enroot = subprocess.run([sqbox_bin, "enroot", "import", "podman://sqbox-test/absent"],
                            env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=60)
    assert enroot.returncode == 1 and enroot.stderr.startswith("[ERROR] image not found: ")
    assert os.listdir(out) == []


def test_no_engine_socket(sqbox_bin, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    missing = tmp_path / "none.sock"
    result = import_command(sqbox_bin, "podman://app", out / "x.sqsh",
                            dict(os.environ, CONTAINER_HOST=f"unix://{missing}"))
    one_line_failure(result, f"cannot reach the podman service: no socket at {missing}")
    result = import_command(sqbox_bin, "dockerd://app", out / "x.sqsh",
                            dict(os.environ, DOCKER_HOST=f"unix://{missing}"))
    one_line_failure(result, f"cannot reach the Docker daemon: no socket at {missing}")
    # A DOCKER_HOST naming a TCP daemon is refused, never replaced by the default socket.
    result = import_command(sqbox_bin, "dockerd://app", out / "x.sqsh",
                            dict(os.environ, DOCKER_HOST="tcp://127.0.0.1:2375"))
    one_line_failure(result, "DOCKER_HOST=tcp://127.0.0.1:2375 is not a unix socket")
    result = import_command(sqbox_bin, "podman://../../containers/json", out / "x.sqsh",
                            dict(os.environ))
    one_line_failure(result, "Invalid image reference: podman://../../containers/json")
    assert os.listdir(out) == []


# ---- a fake engine for answers a real one never gives ----

class UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def fake_engine(path: Path, describe, archive_chunks, archive_status=200):
    """Serves /images/NAME/json with `describe` and /images/NAME/get with the bytes
    `archive_chunks()` yields (no length: the body ends when the connection closes), under
    `archive_status`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def address_string(self):
            return "unix"

        def do_GET(self):
            if self.path.endswith("/json"):
                status, body = describe
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(archive_status)
            self.send_header("Content-Type", "application/x-tar")
            self.end_headers()
            try:
                for chunk in archive_chunks():
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the importer stopped reading: what the test wants

    server = UnixHttpServer(str(path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


IMAGE_ID = "sha256:" + "ab" * 32


@pytest.mark.parametrize("content", ["member", "zeros"])
def test_endless_archive_stops(content, sqbox_bin, tmp_path):
    """An engine that reports a 1000-byte image and then sends without end. A member of a
    terabyte: the import stops at twice the size plus 64 MiB. Zeros: the reader sees the tar's end
    at once and stops, and so does the sender (no hang). One line, nothing left."""
    sent = []

    def endless():
        if content == "member":
            header = tarfile.TarInfo("layer.tar")
            header.size = 1 << 40
            yield header.tobuf(format=tarfile.PAX_FORMAT)
        block = (b"\1" if content == "member" else b"\0") * (1 << 20)
        while True:
            sent.append(len(block))
            yield block

    server = fake_engine(tmp_path / "engine.sock", (200, {"Id": IMAGE_ID, "Size": 1000}), endless)
    out = tmp_path / "out"
    out.mkdir()
    try:
        result = import_command(sqbox_bin, "dockerd://hostile", out / "x.sqsh",
                                dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/engine.sock"))
    finally:
        server.shutdown()
        server.server_close()
    if content == "member":
        one_line_failure(result, "the archive of hostile from the Docker daemon at ")
        assert f"is larger than {2 * 1000 + (64 << 20)} bytes (twice the image's size" in \
            result.stderr
    else:
        one_line_failure(result, "dockerd://hostile: not an OCI image layout")
    assert sum(sent) < (128 << 20)  # it stopped reading, the engine stopped sending
    assert os.listdir(out) == []


def test_endless_error_answer_stops(sqbox_bin, tmp_path):
    """An engine that describes the image, then answers its archive with an error whose body
    never ends: the import keeps the error's start, stops reading, and says so in one line."""
    sent = []

    def endless_error():
        yield b'{"message": "no archive today"}'
        while sum(sent) < (1 << 30):  # a bound for the test only, far past what is kept
            sent.append(1 << 20)
            yield b" " * (1 << 20)

    server = fake_engine(tmp_path / "engine.sock", (200, {"Id": IMAGE_ID, "Size": 1000}),
                         endless_error, archive_status=500)
    out = tmp_path / "out"
    out.mkdir()
    try:
        result = import_command(sqbox_bin, "dockerd://hostile", out / "x.sqsh",
                                dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/engine.sock"))
    finally:
        server.shutdown()
        server.server_close()
    one_line_failure(result, "refused hostile: ")
    assert "(HTTP 500)" in result.stderr
    assert sum(sent) < (64 << 20)  # it stopped reading, the engine stopped sending
    assert os.listdir(out) == []


def test_archive_bomb_from_an_engine_is_refused(sqbox_bin, tmp_path):
    """A small zstd archive expanding to 1 GiB: the docker-archive bound (1100x) applies."""
    need("zstd", "zstd")
    bomb = zstd_tar_of_zeros("padding", 1 << 30)
    server = fake_engine(tmp_path / "engine.sock", (200, {"Id": IMAGE_ID, "Size": len(bomb)}),
                         lambda: iter([bomb]))
    out = tmp_path / "out"
    out.mkdir()
    try:
        result = import_command(sqbox_bin, "podman://bomb", out / "x.sqsh",
                                dict(os.environ, CONTAINER_HOST=f"unix://{tmp_path}/engine.sock"))
    finally:
        server.shutdown()
        server.server_close()
    one_line_failure(result, "podman://bomb: decompresses to more than 1100 times its size")
    assert os.listdir(out) == []


def test_engine_errors_become_one_line(sqbox_bin, tmp_path):
    """The engine's own message, control characters and all, is quoted on one line."""
    server = fake_engine(tmp_path / "engine.sock",
                         (500, {"message": "storage exploded\nsecond line\x1b[31m"}), lambda: [])
    out = tmp_path / "out"
    out.mkdir()
    try:
        result = import_command(sqbox_bin, "dockerd://x", out / "x.sqsh",
                                dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/engine.sock"))
        described = subprocess.run(
            [sqbox_bin, "enroot", "digest", "dockerd://x"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, timeout=60,
            env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/engine.sock"))
    finally:
        server.shutdown()
        server.server_close()
    one_line_failure(result, "refused x: storage exploded second line")
    assert "(HTTP 500)" in result.stderr and "\x1b" not in result.stderr
    assert described.returncode == 1 and described.stderr.startswith("[ERROR] the Docker daemon")
    assert os.listdir(out) == []


def test_permission_denied_on_the_socket(sqbox_bin, tmp_path):
    """A socket the caller may not write to (as docker.sock is kept to the docker group)."""
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    command = [sqbox_bin, "import", "dockerd://app", "-o", str(out / "x.sqsh")]
    directory = tmp_path
    if IS_ROOT:
        # Root passes any mode: the caller is another user, in a directory it may reach.
        need("setpriv", "util-linux")
        directory = Path(tempfile.mkdtemp(prefix="sqbox-engine-", dir="/tmp"))
        directory.chmod(0o755)
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    path = directory / "private.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen()
        os.chmod(path, 0)
        result = subprocess.run(command, env=dict(os.environ, DOCKER_HOST=f"unix://{path}"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                timeout=60)
    finally:
        listener.close()
        if directory != tmp_path:
            shutil.rmtree(directory)
    one_line_failure(result, f"cannot reach the Docker daemon at {path}: Permission denied")
    assert os.listdir(out) == []

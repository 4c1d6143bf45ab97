"""Fixtures for the registry client's tests: the pull driver (tests/registry_pull_tool.cpp), real
registries on loopback and a hostile imitation."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_registry import HostileRegistry  # noqa: E402
from registry_servers import Layout, Registry, TokenServer, htpasswd_auth  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="session")
def pull_tool():
    configured = os.environ.get("SQBOX_REGISTRY_PULL_TOOL")
    path = Path(configured) if configured else REPOSITORY / "build" / "tests" / "registry_pull_tool"
    if not path.is_file():
        pytest.fail(f"the registry pull driver is not built: {path}")
    return path


class Puller:
    """Runs the driver with a cache and a config directory of the test's own."""

    def __init__(self, tool, workdir):
        self.tool = tool
        self.cache = workdir / "cache"
        self.config = workdir / "config"
        self.config.mkdir()
        self.docker_config = workdir / "docker-config.json"

    def run(self, command, uri, *options, env=None, timeout=120, text=True):
        argv = [str(self.tool), command, uri, "--cache", str(self.cache),
                "--config", str(self.config), "--docker-config", str(self.docker_config),
                "--allow-http", *options]
        environment = dict(os.environ)
        for name in ("ENROOT_TRANSFER_RETRIES", "ENROOT_CONNECT_TIMEOUT",
                     "ENROOT_TRANSFER_TIMEOUT", "ENROOT_MAX_CONNECTIONS"):
            environment.pop(name, None)
        environment.update(env or {})
        return subprocess.run(argv, capture_output=True, text=text, timeout=timeout,
                              env=environment)

    def pull(self, uri, *options, **kwargs):
        result = self.run("pull", uri, *options, **kwargs)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def fails(self, uri, *options, command="pull", **kwargs):
        """The one line a failed pull prints, after checking it is one line and exit 125."""
        result = self.run(command, uri, *options, **kwargs)
        assert result.returncode == 125, (result.returncode, result.stdout, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("sqbox: "), result.stderr
        assert result.stdout == ""
        return lines[0]

    def cached_files(self):
        if not self.cache.exists():
            return []
        return sorted(str(p.relative_to(self.cache)) for p in self.cache.rglob("*")
                      if not p.is_dir())

    def credentials(self, text):
        (self.config / ".credentials").write_text(text)


@pytest.fixture
def puller(pull_tool, tmp_path):
    return Puller(pull_tool, tmp_path)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Test images: `base` (three layers), `derived` (base's layers and one more) and `multi`
    (an index of an amd64 and an arm64 image)."""
    layout = Layout(tmp_path_factory.mktemp("layout"))
    base_layers = [{"etc/os-release": b"ID=sqbox-test\n"},
                   {"usr/bin/tool": b"#!/bin/sh\necho tool\n" * 50},
                   {"data/big.bin": os.urandom(3 << 20)}]
    base = layout.image(base_layers)
    derived = layout.image(base_layers + [{"app/main.py": b"print('derived')\n"}])
    amd64 = layout.image([{"arch": b"amd64\n"}], architecture="amd64")
    arm64 = layout.image([{"arch": b"arm64\n"}], architecture="arm64")
    multi = layout.index({"amd64": amd64, "arm64": arm64})
    layout.tag("base", base)
    layout.tag("derived", derived)
    layout.tag("multi", multi)
    return {"layout": layout, "base": base, "derived": derived, "amd64": amd64, "arm64": arm64}


def _push_all(registry, layouts):
    layout = layouts["layout"]
    registry.push(layout, "base", "test/base:1")
    registry.push(layout, "derived", "test/derived:1")
    registry.push(layout, "multi", "test/multi:1", all_platforms=True)


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory, layouts):
    registry = Registry(tmp_path_factory.mktemp("registry-open"))
    try:
        _push_all(registry, layouts)
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="module")
def htpasswd_registry(tmp_path_factory, layouts):
    workdir = tmp_path_factory.mktemp("registry-htpasswd")
    registry = Registry(workdir, htpasswd_auth(workdir, "alice", "wonder land"))
    try:
        registry.push_credentials = "alice:wonder land"
        _push_all(registry, layouts)
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory, layouts):
    workdir = tmp_path_factory.mktemp("registry-token")
    tokens = TokenServer(workdir, credentials=("bob", "builder"))
    registry = Registry(workdir, tokens.registry_auth())
    try:
        registry.push_credentials = "bob:builder"
        _push_all(registry, layouts)
        registry.tokens = tokens
        yield registry
    finally:
        registry.stop()
        tokens.stop()


@pytest.fixture(scope="module")
def hostile():
    server = HostileRegistry()
    try:
        yield server
    finally:
        server.stop()

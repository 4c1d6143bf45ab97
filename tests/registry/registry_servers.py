"""Real registry servers on loopback for the registry client's tests.

- `docker-registry` (Debian's Distribution 2.8) with its own config and storage, anonymous, behind
  htpasswd (bcrypt, from apache2-utils) or behind token auth, with a certificate made by openssl;
- TokenServer: a small issuer of the JWTs that registry accepts (RS256, the certificate in x5c);
- OCI image layouts written by hand (several layers, a two-architecture index), pushed with skopeo.
"""
import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def require(command, package):
    if shutil.which(command) is None:
        pytest.skip(f"{command} is missing (Debian package {package})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# --- OCI layouts ------------------------------------------------------------------------------

def layer_tar(files):
    """A gzip-compressed tar of {path: bytes | (bytes, mode) | ("symlink", target)},
    reproducible; returns it and its uncompressed digest (the diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            info.mode = 0o644
            if isinstance(content, tuple) and content[0] == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = content[1]
                tar.addfile(info)
                continue
            if isinstance(content, tuple):
                content, info.mode = content
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    uncompressed = raw.getvalue()
    return gzip.compress(uncompressed, mtime=0), sha256(uncompressed)


class Layout:
    """An OCI image layout directory being written: blobs, manifests, tags in index.json."""

    def __init__(self, path):
        self.path = Path(path)
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.tags = []

    def blob(self, data, media_type):
        digest = sha256(data)
        (self.path / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, layers, architecture="amd64", env=("PATH=/usr/bin:/bin",)):
        """An image manifest of `layers` ([{path: bytes}], base first); returns its descriptor
        and the layers' blobs."""
        descriptors, blobs, diff_ids = [], [], []
        for files in layers:
            compressed, diff_id = layer_tar(files)
            descriptors.append(self.blob(compressed, "application/vnd.oci.image.layer.v1.tar+gzip"))
            blobs.append(compressed)
            diff_ids.append(diff_id)
        config = {"architecture": architecture, "os": "linux",
                  "config": {"Env": list(env), "Cmd": ["/bin/sh"]},
                  "rootfs": {"type": "layers", "diff_ids": diff_ids}}
        config_descriptor = self.blob(json.dumps(config).encode(),
                                      "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_descriptor, "layers": descriptors}
        manifest_bytes = json.dumps(manifest).encode()
        descriptor = self.blob(manifest_bytes, "application/vnd.oci.image.manifest.v1+json")
        return {"descriptor": descriptor, "config": config, "layers": blobs,
                "manifest": manifest_bytes, "config_digest": config_descriptor["digest"]}

    def index(self, images):
        """An index of {architecture: image}."""
        manifests = []
        for architecture, image in images.items():
            entry = dict(image["descriptor"])
            entry["platform"] = {"os": "linux", "architecture": architecture}
            manifests.append(entry)
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": manifests}
        return {"descriptor": self.blob(json.dumps(index).encode(),
                                        "application/vnd.oci.image.index.v1+json")}

    def tag(self, name, item):
        entry = dict(item["descriptor"])
        entry["annotations"] = {"org.opencontainers.image.ref.name": name}
        self.tags.append(entry)
        (self.path / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "manifests": self.tags}))


# --- docker-registry ---------------------------------------------------------------------------

class Registry:
    def __init__(self, workdir, auth=None):
        require("docker-registry", "docker-registry")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = self.workdir / "registry.log"
        self.push_credentials = None
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  accesslog:",
            "    disabled: false",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.workdir / 'storage'}",
            "http:",
            f"  addr: {self.address}",
        ]
        lines += auth or []
        config = self.workdir / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for credentials
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.skip("docker-registry (Debian package docker-registry) did not start: "
                                + self.log_path.read_text()[-500:])
                time.sleep(0.1)

    def push(self, layout, tag, repository, all_platforms=False):
        require("skopeo", "skopeo")
        argv = ["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false", "-q"]
        if all_platforms:
            argv.append("--all")
        if self.push_credentials:
            argv += ["--dest-creds", self.push_credentials]
        argv += [f"oci:{layout.path}:{tag}", f"docker://{self.address}/{repository}"]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def blob_requests(self, repository):
        return self.log_path.read_text().count(f'"GET /v2/{repository}/blobs/')

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def htpasswd_auth(workdir, user, password):
    require("htpasswd", "apache2-utils")
    path = Path(workdir) / "htpasswd"
    subprocess.run(["htpasswd", "-Bbc", str(path), user, password], check=True,
                   capture_output=True)
    return ["auth:", "  htpasswd:", "    realm: sqbox-test", f"    path: {path}"]


# --- the token server --------------------------------------------------------------------------

class TokenServer:
    """Issues registry tokens (JWT, RS256, the certificate in the header's x5c) to callers with
    the right Basic credentials, or to anyone when `credentials` is None."""

    def __init__(self, workdir, credentials=None):
        require("openssl", "openssl")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key = self.workdir / "token.key"
        self.cert = self.workdir / "token.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=sqbox-test-token-issuer", "-keyout", str(self.key),
                        "-out", str(self.cert)], check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.credentials = credentials
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Authorization")))
                if server.credentials is not None:
                    expected = "Basic " + base64.b64encode(
                        ":".join(server.credentials).encode()).decode()
                    if self.headers.get("Authorization") != expected:
                        self.send_response(401)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                body = json.dumps({"token": server.token(query.get("service", [""])[0],
                                                         query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        import urllib.parse  # noqa: F401  (used by the handler)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def token(self, service, scopes):
        access = []
        for scope in scopes:
            for item in scope.split(" "):
                kind, _, rest = item.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "x5c": [self.x5c]}
        claims = {"iss": "sqbox-test-issuer", "sub": "tester", "aud": service, "exp": now + 600,
                  "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing_input = (b64url(json.dumps(header).encode()) + "." +
                         b64url(json.dumps(claims).encode())).encode()
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                                   input=signing_input, check=True, capture_output=True).stdout
        return signing_input.decode() + "." + b64url(signature)

    def registry_auth(self):
        return ["auth:", "  token:", f"    realm: {self.realm}", "    service: sqbox-test",
                "    issuer: sqbox-test-issuer", f"    rootcertbundle: {self.cert}"]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

"""A registry imitation on loopback that misbehaves on purpose, one way per repository name.

Every repository serves the same small image (a config and one layer); what differs is how:
  good          correctly (proves the imitation itself is a registry the client accepts)
  bad-digest    the layer with one byte changed
  truncated     the layer cut in half under a Content-Length announcing all of it
  short         the layer cut in half, no Content-Length, the connection closed
  oversized     the layer followed by more bytes than its declared size
  huge-manifest a manifest of 5 MiB
  redirect-loop manifests that redirect to themselves
  unauthorized  a 401 challenge, a token, and 401 again with the token
  slow          a manifest that starts and then stalls
  flaky         503 on the first request for each blob, then the blob
  redirected    token auth, blobs redirected (307) to storage on another host name, which records
                the Authorization headers it receives
"""
import http.server
import json
import threading
import time

from registry_servers import layer_tar, sha256


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class Storage:
    """Blob storage on another origin (a different host name for the same loopback)."""

    def __init__(self, blobs):
        self.authorization_seen = []
        storage = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                storage.authorization_seen.append(self.headers.get("Authorization"))
                data = blobs.get(self.path.rsplit("/", 1)[-1])
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class HostileRegistry:
    def __init__(self):
        layer, _ = layer_tar({"hello.txt": b"hello from a hostile registry\n" * 100})
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                             "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        self.layer, self.config = layer, config
        self.layer_digest, self.config_digest = sha256(layer), sha256(config)
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": self.config_digest, "size": len(config)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                "digest": self.layer_digest, "size": len(layer)}]}
        self.manifest = json.dumps(manifest).encode()
        self.manifest_digest = sha256(self.manifest)
        self.blobs = {self.layer_digest: layer, self.config_digest: config}
        self.storage = Storage(self.blobs)
        self.flaky_seen = set()
        self.authorization_seen = []
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_body(self, status, body, content_type="application/octet-stream",
                          headers=()):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def challenge(self):
                realm = f"http://127.0.0.1:{registry.port}/token"
                self.send_body(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}',
                               "application/json",
                               [("WWW-Authenticate",
                                 f'Bearer realm="{realm}",service="hostile",'
                                 'scope="repository:x:pull"')])

            def do_GET(self):
                registry.authorization_seen.append((self.path,
                                                    self.headers.get("Authorization")))
                if self.path.startswith("/token"):
                    self.send_body(200, b'{"token":"opaque-token"}', "application/json")
                    return
                parts = self.path.split("/")  # "", "v2", repo, image, kind, reference
                if len(parts) != 6 or parts[1] != "v2":
                    self.send_body(404, b"{}")
                    return
                repo, kind, reference = parts[2], parts[4], parts[5]
                getattr(self, "serve_" + repo.replace("-", "_"), self.serve_good)(kind, reference)

            def serve_good(self, kind, reference):
                if kind == "manifests":
                    self.send_body(200, registry.manifest,
                                   "application/vnd.oci.image.manifest.v1+json",
                                   [("Docker-Content-Digest", registry.manifest_digest)])
                elif reference in registry.blobs:
                    self.send_body(200, registry.blobs[reference])
                else:
                    self.send_body(404, b'{"errors":[{"code":"BLOB_UNKNOWN","message":"x"}]}')

            def serve_bad_digest(self, kind, reference):
                if kind == "blobs" and reference == registry.layer_digest:
                    data = bytearray(registry.layer)
                    data[len(data) // 2] ^= 0xFF
                    self.send_body(200, bytes(data))
                else:
                    self.serve_good(kind, reference)

            def serve_truncated(self, kind, reference):
                if kind == "blobs" and reference == registry.layer_digest:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(registry.layer)))
                    self.end_headers()
                    self.wfile.write(registry.layer[: len(registry.layer) // 2])
                    self.close_connection = True
                else:
                    self.serve_good(kind, reference)

            def serve_short(self, kind, reference):
                if kind == "blobs" and reference == registry.layer_digest:
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(registry.layer[: len(registry.layer) // 2])
                    self.close_connection = True
                else:
                    self.serve_good(kind, reference)

            def serve_oversized(self, kind, reference):
                if kind == "blobs" and reference == registry.layer_digest:
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(registry.layer + b"\0" * (1 << 20))
                    self.close_connection = True
                else:
                    self.serve_good(kind, reference)

            def serve_huge_manifest(self, kind, reference):
                if kind == "manifests":
                    padding = " " * (5 << 20)
                    self.send_body(200, registry.manifest[:-1] + padding.encode() + b"}",
                                   "application/vnd.oci.image.manifest.v1+json")
                else:
                    self.serve_good(kind, reference)

            def serve_redirect_loop(self, kind, reference):
                self.send_body(302, b"", headers=[("Location", self.path)])

            def serve_unauthorized(self, kind, reference):
                self.challenge()

            def serve_slow(self, kind, reference):
                self.send_response(200)
                self.send_header("Content-Length", str(len(registry.manifest)))
                self.end_headers()
                self.wfile.write(registry.manifest[:10])
                self.wfile.flush()
                time.sleep(20)
                self.close_connection = True

            def serve_flaky(self, kind, reference):
                if kind == "blobs" and reference not in registry.flaky_seen:
                    registry.flaky_seen.add(reference)
                    self.send_body(503, b'{"errors":[{"code":"UNAVAILABLE","message":"busy"}]}')
                else:
                    self.serve_good(kind, reference)

            def serve_redirected(self, kind, reference):
                if self.headers.get("Authorization") != "Bearer opaque-token":
                    self.challenge()
                elif kind == "blobs":
                    location = f"http://localhost:{registry.storage.port}/storage/{reference}"
                    self.send_body(307, b"", headers=[("Location", location)])
                else:
                    self.serve_good(kind, reference)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.storage.stop()



"""The registry client (src/import/registry.h) against docker-registry on loopback: what it pulls
is what was pushed, byte for byte, and what is cached is not fetched again."""
import base64
import hashlib
import json
import subprocess


def file_digest(path):
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def expected_layers(image):
    return ["sha256:" + hashlib.sha256(blob).hexdigest() for blob in image["layers"]]


def test_pulls_the_layers_and_config_that_were_pushed(puller, open_registry, layouts):
    image = layouts["base"]
    pulled = puller.pull(f"docker://{open_registry.address}#test/base:1")
    assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(image)
    for layer, blob in zip(pulled["layers"], image["layers"]):
        assert open(layer["blob"], "rb").read() == blob
        assert layer["media_type"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert pulled["config"] == image["config"]
    assert pulled["manifest_digest"] == "sha256:" + hashlib.sha256(image["manifest"]).hexdigest()
    # Only verified blobs, under their digests: nothing else is left in the cache.
    names = {f"blobs/sha256/{d[7:]}" for d in expected_layers(image) + [image["config_digest"]]}
    assert set(puller.cached_files()) == names


def test_docker_style_uri_names_the_same_image(puller, open_registry, layouts):
    pulled = puller.pull(f"docker://{open_registry.address}/test/base:1")
    assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(layouts["base"])


def test_a_second_pull_and_shared_layers_download_nothing_again(puller, open_registry, layouts):
    uri = f"docker://{open_registry.address}#test/base:1"
    before = open_registry.blob_requests("test/base")
    puller.pull(uri)
    first = open_registry.blob_requests("test/base")
    assert first - before == 4  # three layers and the config
    puller.pull(uri)
    assert open_registry.blob_requests("test/base") == first
    # derived shares base's three layers: only its own layer and config are fetched.
    before_derived = open_registry.blob_requests("test/derived")
    pulled = puller.pull(f"docker://{open_registry.address}#test/derived:1")
    assert open_registry.blob_requests("test/derived") - before_derived == 2
    assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(layouts["derived"])


def test_a_manifest_list_gives_the_requested_architecture(puller, open_registry, layouts):
    uri = f"docker://{open_registry.address}#test/multi:1"
    for architecture, name in (("amd64", "amd64"), ("arm64", "arm64"), ("aarch64", "arm64"),
                               ("x86_64", "amd64")):
        pulled = puller.pull(uri, "--arch", architecture)
        assert pulled["config"]["architecture"] == name
        assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(layouts[name])
    line = puller.fails(uri, "--arch", "ppc64le")
    assert "no linux/ppc64le image" in line and "linux/amd64, linux/arm64" in line


def test_digest_is_the_platform_manifests_digest(puller, open_registry, layouts):
    uri = f"docker://{open_registry.address}#test/multi:1"
    for architecture in ("amd64", "arm64"):
        raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw",
                              "--override-arch", architecture,
                              f"docker://{open_registry.address}/test/multi:1"],
                             capture_output=True, check=True).stdout
        index = json.loads(raw)
        wanted = [m["digest"] for m in index["manifests"]
                  if m["platform"]["architecture"] == architecture]
        result = puller.run("digest", uri, "--arch", architecture)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["digest"] == wanted[0]
        assert wanted[0] == layouts[architecture]["descriptor"]["digest"]
    assert puller.cached_files() == []  # digest fetches no blobs


def test_by_digest_pulls_that_manifest(puller, open_registry, layouts):
    digest = layouts["arm64"]["descriptor"]["digest"]
    pulled = puller.pull(f"docker://{open_registry.address}#test/multi@{digest}")
    assert pulled["manifest_digest"] == digest
    assert pulled["config"]["architecture"] == "arm64"


def test_unknown_image_and_plain_http_without_opt_in(puller, open_registry):
    line = puller.fails(f"docker://{open_registry.address}#test/absent:1")
    assert "image not found" in line and "test/absent" in line
    # Without --allow-http the client speaks TLS to the plain-HTTP registry and fails cleanly.
    result = subprocess.run([str(puller.tool), "pull",
                             f"docker://{open_registry.address}#test/base:1",
                             "--cache", str(puller.cache), "--retries", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 125
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert puller.cached_files() == []


def test_htpasswd_registry_needs_credentials(puller, htpasswd_registry, layouts):
    uri = f"docker://{htpasswd_registry.address}#test/base:1"
    assert "requires credentials" in puller.fails(uri)
    puller.credentials("machine 127.0.0.1 login alice password wrong\n")
    assert "refused access" in puller.fails(uri)
    assert puller.cached_files() == []
    # enroot's .credentials (netrc), the password with a space quoted.
    puller.credentials('machine 127.0.0.1 login alice password "wonder land"\n')
    pulled = puller.pull(uri)
    assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(layouts["base"])


def test_htpasswd_credentials_from_enroot_password_command(puller, htpasswd_registry):
    puller.credentials("machine 127.0.0.1 login alice password $(printf 'wonder land')\n")
    puller.pull(f"docker://{htpasswd_registry.address}#test/multi:1", "--arch", "amd64")


def test_htpasswd_credentials_from_docker_config(puller, htpasswd_registry):
    auth = base64.b64encode(b"alice:wonder land").decode()
    puller.docker_config.write_text(json.dumps(
        {"auths": {htpasswd_registry.address: {"auth": auth}}}))
    puller.pull(f"docker://{htpasswd_registry.address}#test/multi:1", "--arch", "arm64")
    # A user named in the URI must be the one the config has.
    line = puller.fails(f"docker://carol@{htpasswd_registry.address}#test/multi:1")
    assert "no password for carol" in line


def test_token_registry_bearer_flow(puller, token_registry, layouts):
    uri = f"docker://{token_registry.address}#test/derived:1"
    line = puller.fails(uri)
    assert "token server" in line and "refused" in line
    puller.credentials("machine 127.0.0.1 login bob password builder\n")
    pulled = puller.pull(uri)
    assert [layer["digest"] for layer in pulled["layers"]] == expected_layers(layouts["derived"])
    # The token request carried the scope the registry asked for.
    assert any("scope=repository%3atest%2fderived%3apull" in path.lower()
               for path, _ in token_registry.tokens.requests)


def test_progress_only_when_asked(puller, open_registry):
    uri = f"docker://{open_registry.address}#test/derived:1"
    quiet = puller.run("pull", uri)
    assert quiet.returncode == 0 and quiet.stderr == ""
    shown = puller.run("pull", f"docker://{open_registry.address}#test/base:1", "--progress",
                       text=False)
    assert shown.returncode == 0, shown.stderr
    assert b"\rsqbox: downloading 1 blob: " in shown.stderr  # the config; the layers are cached
    assert shown.stderr.endswith(b"\r\033[K")  # the line is cleared once done

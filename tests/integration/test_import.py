"""sqbox import: images built by the real tools (umoci, skopeo) from rootfs directories and layer
archives this test writes, imported with `sqbox import` and the enroot front end, run with
`sqbox run`, and compared entry by entry with the same layers applied by umoci (`umoci unpack`,
rootless when not root). Hostile layers (crafted with tarfile) must fail with one line, exit 125
and nothing left behind.
"""
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
ENROOT_FILES = {"etc/rc", "etc/rc.local", "etc/environment", "etc/fstab"}


def need(tool, package):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is missing (Debian package {package})")


def run(argv, **kwargs):
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=300, **kwargs)
    assert result.returncode == 0, f"{argv}: {result.stderr}"
    return result


def busybox_path():
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.exists(candidate):
            return candidate
    pytest.skip("busybox is missing (Debian package busybox-static)")


def write_base_rootfs(rootfs: Path):
    """The first layer: busybox, hard links, a setuid file, xattrs, symlinks, owners."""
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox_path(), rootfs / "bin/busybox")
    for name in ("sh", "cat", "ls", "stat", "id", "test"):
        os.symlink("busybox", rootfs / "bin" / name)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc/greeting").write_text("hello from layer one\n")
    os.link(rootfs / "etc/greeting", rootfs / "etc/greeting-link")
    (rootfs / "data").mkdir()
    (rootfs / "data/big").write_bytes(os.urandom(300 * 1024) + b"\0" * (256 * 1024))
    (rootfs / "data/gone").write_text("whited out by layer two\n")
    (rootfs / "data/replaced").write_text("old content\n")
    (rootfs / "opaque").mkdir()
    (rootfs / "opaque/old-a").write_text("a\n")
    (rootfs / "opaque/old-dir").mkdir()
    (rootfs / "opaque/old-dir/deep").write_text("deep\n")
    (rootfs / "suid").write_text("#!/bin/sh\n")
    os.chmod(rootfs / "suid", 0o4755)
    (rootfs / "sgid-dir").mkdir()
    os.chmod(rootfs / "sgid-dir", 0o2775)
    os.symlink("/etc/greeting", rootfs / "abs-link")
    os.symlink("../../../../outside", rootfs / "data/escaping-link")
    os.setxattr(rootfs / "etc/greeting", "user.origin", b"layer-one")
    os.setxattr(rootfs / "data", "user.dir-attr", b"yes")
    os.utime(rootfs / "etc/greeting", (1_000_000_000, 1_000_000_000))
    if IS_ROOT:
        os.chown(rootfs / "data/replaced", 1234, 5678)
        os.chown(rootfs / "sgid-dir", 42, 43)


def tar_layer(path: Path, members):
    """An uncompressed layer tar of (TarInfo, bytes-or-None) pairs."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)


def entry(name, kind=tarfile.REGTYPE, mode=0o644, uid=0, gid=0, mtime=1_600_000_000, **extra):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = mtime
    for key, value in extra.items():
        setattr(info, key, value)
    return info


@pytest.fixture(scope="module")
def oci_image(tmp_path_factory):
    """An OCI layout with three layers: umoci's from a rootfs, umoci's diff of a changed rootfs
    (whiteouts), and a raw layer with an opaque directory, a hard link and a pax xattr."""
    need("umoci", "umoci")
    work = tmp_path_factory.mktemp("oci")
    layout = work / "layout"
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:test"])
    bundle = work / "bundle"
    rootless = [] if IS_ROOT else ["--rootless"]
    run(["umoci", "unpack", *rootless, "--image", f"{layout}:test", str(bundle)])
    rootfs = bundle / "rootfs"
    write_base_rootfs(rootfs)
    run(["umoci", "repack", "--image", f"{layout}:test", str(bundle)])
    # Layer two, by umoci from the changed tree: whiteouts for what went.
    (rootfs / "data/gone").unlink()
    (rootfs / "data/replaced").unlink()
    (rootfs / "data/replaced").write_text("new content\n")
    (rootfs / "layer-two").write_text("2\n")
    run(["umoci", "repack", "--image", f"{layout}:test", str(bundle)])
    # Layer three, written here: an opaque directory, a hard link across layers, an xattr.
    raw = work / "layer3.tar"
    tar_layer(raw, [
        (entry("opaque", tarfile.DIRTYPE, mode=0o750), None),
        (entry("opaque/.wh..wh..opq"), b""),
        (entry("opaque/new-b"), b"b\n"),
        (entry("etc/third-link", tarfile.LNKTYPE, linkname="etc/greeting"), None),
        (entry("caps", mode=0o755, pax_headers={"SCHILY.xattr.user.cap": "v"}), b"x"),
        (entry("dev", tarfile.DIRTYPE, mode=0o755), None),
        (entry("dev/null-node", tarfile.CHRTYPE, devmajor=1, devminor=3), None),
    ])
    run(["umoci", "raw", "add-layer", "--image", f"{layout}:test", str(raw)])
    run(["umoci", "config", "--image", f"{layout}:test", "--config.entrypoint", "/bin/sh",
         "--config.cmd", "-c", "--config.cmd", "echo from-cmd; cat /etc/greeting",
         "--config.env", "IMPORTED=yes", "--config.env", "PATH=/bin",
         "--config.workingdir", "/work/dir", "--config.volume", "/data"])
    # The reference: the same layers applied by umoci.
    reference = work / "reference"
    run(["umoci", "unpack", *rootless, "--image", f"{layout}:test", str(reference)])
    return {"layout": layout, "reference": reference / "rootfs", "work": work}


def tree_of(root: Path, owners: bool):
    """Every entry below `root`: type, permission bits, size, content digest, link target,
    user.* xattrs, mtime, hard-link group and (when asked) owners."""
    result = {}
    inodes = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory) / name
            relative = str(path.relative_to(root))
            st = path.lstat()
            record = {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode)}
            if stat.S_ISREG(st.st_mode):
                record["sha"] = hashlib.sha256(path.read_bytes()).hexdigest()
                record["mtime"] = int(st.st_mtime)
                inodes.setdefault((st.st_dev, st.st_ino), []).append(relative)
            elif stat.S_ISLNK(st.st_mode):
                record["target"] = os.readlink(path)
            if not stat.S_ISLNK(st.st_mode):
                record["xattrs"] = {
                    key: os.getxattr(path, key, follow_symlinks=False)
                    for key in os.listxattr(path, follow_symlinks=False)
                    if key.startswith("user.") and key != "user.rootlesscontainers"}
            if owners:
                record["owner"] = (st.st_uid, st.st_gid)
            result[relative] = record
    groups = [sorted(paths) for paths in inodes.values() if len(paths) > 1]
    return result, sorted(groups)


def unpack_squashfs(image: Path, directory: Path):
    need("unsquashfs", "squashfs-tools")
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(directory), str(image)],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=300)


def permission_bits(text: str) -> int:
    """`ls -l`'s permission string (without the type letter) as mode bits."""
    bits = 0
    for group, shift, special_bit in ((text[0:3], 6, 0o4000), (text[3:6], 3, 0o2000),
                                      (text[6:9], 0, 0o1000)):
        if group[0] == "r":
            bits |= 4 << shift
        if group[1] == "w":
            bits |= 2 << shift
        if group[2] in "xst":
            bits |= 1 << shift
        if group[2] in "sStT":
            bits |= special_bit
    return bits


def image_listing(image: Path):
    """Modes and owners as the image holds them (unsquashfs, unprivileged, drops setgid bits
    and owners when it extracts)."""
    listing = subprocess.run(["unsquashfs", "-lln", str(image)], stdout=subprocess.PIPE,
                             text=True, check=True).stdout
    entries = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) < 6 or not fields[5].startswith("squashfs-root/"):
            continue
        uid, gid = fields[1].split("/")
        entries[fields[5][len("squashfs-root/"):]] = (permission_bits(fields[0][1:]),
                                                      (int(uid), int(gid)))
    return entries


def assert_same_as_reference(image: Path, reference: Path, scratch: Path):
    unpacked = scratch / "unpacked"
    unpack_squashfs(image, unpacked)
    got, got_links = tree_of(unpacked, owners=IS_ROOT)
    for path, (mode, owner) in image_listing(image).items():
        if path in got:
            got[path]["mode"] = mode
            if IS_ROOT:
                got[path]["owner"] = owner
    want, want_links = tree_of(reference, owners=IS_ROOT)
    for name in ENROOT_FILES | {"work", "work/dir"}:
        got.pop(name, None)
        want.pop(name, None)
    # enroot leaves /dev's contents out of images; umoci's reference keeps them.
    want = {path: record for path, record in want.items() if not path.startswith("dev/")}
    assert sorted(set(got) - set(want)) == [] and sorted(set(want) - set(got)) == []
    for path in want:
        assert got[path] == want[path], path
    assert got_links == want_links
    return got


@pytest.mark.parametrize("transport", ["oci", "oci-archive", "docker-archive"])
def test_import_matches_layers_applied_by_umoci(transport, oci_image, sqbox_bin, tmp_path):
    layout = oci_image["layout"]
    if transport == "oci":
        uri = f"oci:{layout}:test"
    else:
        need("skopeo", "skopeo")
        archive = tmp_path / f"image.{transport}.tar"
        run(["skopeo", "copy", "--quiet", f"oci:{layout}:test", f"{transport}:{archive}"])
        uri = f"{transport}:{archive}"
    output = tmp_path / "out" / "image.sqsh"
    output.parent.mkdir()
    run([sqbox_bin, "import", uri, "-o", str(output)])
    assert sorted(os.listdir(output.parent)) == ["image.sqsh"]  # no temporary left
    got = assert_same_as_reference(output, oci_image["reference"], tmp_path)
    # The points of the layers, checked directly too.
    assert "data/gone" not in got and "opaque/old-a" not in got and "opaque/old-dir" not in got
    assert got["opaque/new-b"]["sha"] == hashlib.sha256(b"b\n").hexdigest()
    assert got["suid"]["mode"] == 0o4755
    assert got["sgid-dir"]["mode"] == 0o2775
    assert got["etc/greeting"]["xattrs"] == {"user.origin": b"layer-one"}
    assert got["caps"]["xattrs"] == {"user.cap": b"v"}
    assert got["data/escaping-link"]["target"] == "../../../../outside"
    if IS_ROOT:
        assert got["data/replaced"]["owner"] == (0, 0)
        assert got["sgid-dir"]["owner"] == (42, 43)


def test_imported_image_runs_as_enroot_made_it(oci_image, sqbox_bin, sqbox, tmp_path):
    output = tmp_path / "image.sqsh"
    run([sqbox_bin, "import", f"oci:{oci_image['layout']}:test", "-o", str(output)])
    unpack_squashfs(output, tmp_path / "files")
    files = tmp_path / "files"
    assert (files / "etc/environment").read_text() == "IMPORTED=yes\nPATH=/bin\n"
    assert (files / "etc/fstab").read_text() == (
        "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n")
    rc = (files / "etc/rc").read_text()
    assert rc.startswith(f"# enroot-provenance: oci:{oci_image['layout']}:test\n")
    assert "exec '/bin/sh' \"$@\"\n" in rc
    assert "exec '/bin/sh' '-c' 'echo from-cmd; cat /etc/greeting'\n" in rc
    assert (files / "work/dir").is_dir()

    # The enroot front end runs /etc/rc: the working directory, the environment, the command.
    result = subprocess.run([sqbox_bin, "enroot", "start", str(output)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from-cmd\nhello from layer one\n"
    result = subprocess.run([sqbox_bin, "enroot", "start", str(output), "-c", "pwd; echo $IMPORTED"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.stdout == "/work/dir\nyes\n", result.stderr
    # sqbox run sees the layers' result: hard links are one file.
    result = sqbox.run(str(output), "/bin/sh", "-c",
                       "cat /etc/third-link; stat -c %i /etc/greeting /etc/third-link; "
                       "test -e /data/gone || echo gone-is-gone")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hello from layer one"
    assert lines[1] == lines[2]
    assert lines[3] == "gone-is-gone"


def test_enroot_import_load_and_digest(oci_image, sqbox_bin, tmp_path):
    layout = oci_image["layout"]
    env = dict(os.environ, ENROOT_DATA_PATH=str(tmp_path / "data"),
               ENROOT_CONFIG_PATH=str(tmp_path / "config"))
    result = run([sqbox_bin, "enroot", "import", f"oci:{layout}:test"], cwd=tmp_path, env=env)
    assert (tmp_path / "layout+test.sqsh").is_file(), result.stderr
    again = subprocess.run([sqbox_bin, "enroot", "import", f"oci:{layout}:test"], cwd=tmp_path,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert again.returncode == 1 and "File already exists" in again.stderr
    digest = run([sqbox_bin, "enroot", "digest", f"oci:{layout}:test"], env=env).stdout.strip()
    index = json.loads((layout / "index.json").read_text())
    assert digest == index["manifests"][0]["digest"]
    run([sqbox_bin, "enroot", "load", "-n", "loaded", f"oci:{layout}:test"], env=env)
    result = subprocess.run([sqbox_bin, "enroot", "start", "loaded", "-c", "cat /layer-two"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2\n"


# ---- hostile layers ----

def write_layout(directory: Path, layers, config=None, corrupt_digest=False,
                 media_type="application/vnd.oci.image.layer.v1.tar+gzip"):
    """An OCI image layout written here, with `layers` as gzip'd tar bytes."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def add(data: bytes):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    config_digest, config_size = add(json.dumps(config or {"config": {}}).encode())
    descriptors = []
    for layer in layers:
        digest, size = add(layer)
        descriptors.append({"mediaType": media_type,
                            "digest": digest, "size": size})
    if corrupt_digest:
        path = blobs / descriptors[0]["digest"][7:]
        path.write_bytes(path.read_bytes() + b"tampered")
    manifest = json.dumps({"schemaVersion": 2, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
        "size": config_size}, "layers": descriptors}).encode()
    manifest_digest, manifest_size = add(manifest)
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": manifest_size}]}))


def gz_layer(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return gzip.compress(buffer.getvalue())


def import_fails(sqbox_bin, tmp_path, layers, expected, **layout_options):
    layout = tmp_path / "layout"
    write_layout(layout, layers, **layout_options)
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sqbox_bin, "import", f"oci:{layout}", "-o", str(out / "x.sqsh")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=120)
    assert result.returncode == 125, result.stderr
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert os.listdir(out) == []  # neither the image nor a temporary file
    return result


def test_dot_dot_is_refused(sqbox_bin, tmp_path):
    import_fails(sqbox_bin, tmp_path, [gz_layer([(entry("a/../../escape"), b"x")])],
                 "leads out of the image")


def test_hard_link_out_of_the_tree_is_refused(sqbox_bin, tmp_path):
    import_fails(sqbox_bin, tmp_path, [gz_layer([
        (entry("link", tarfile.LNKTYPE, linkname="../../etc/passwd"), None)])],
        "leads out of the image")


def test_hard_link_to_nothing_is_refused(sqbox_bin, tmp_path):
    import_fails(sqbox_bin, tmp_path, [gz_layer([
        (entry("link", tarfile.LNKTYPE, linkname="/etc/shadow"), None)])],
        "not in the image")


def test_digest_mismatch_is_refused(sqbox_bin, tmp_path):
    import_fails(sqbox_bin, tmp_path, [gz_layer([(entry("f"), b"x")])], "digest mismatch",
                 corrupt_digest=True)


def test_truncated_layer_is_refused(sqbox_bin, tmp_path):
    whole = gz_layer([(entry("big"), os.urandom(200_000))])
    import_fails(sqbox_bin, tmp_path, [whole[: len(whole) // 2]], "layer 1")


def test_huge_declared_size_is_refused(sqbox_bin, tmp_path):
    buffer = io.BytesIO()
    info = entry("huge")
    info.size = 1 << 40
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    buffer.write(header + b"\0" * 4096)
    import_fails(sqbox_bin, tmp_path, [gzip.compress(buffer.getvalue())], "layer 1")


def zstd_tar_of_zeros(name, size):
    """A tar stream holding one member of `size` zero bytes, compressed with zstd -19: a few
    KiB for a GiB."""
    info = entry(name)
    info.size = size
    zeros = subprocess.Popen(["zstd", "-q", "-19", "-c", "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(zeros.stdout.read()))
    reader.start()
    zeros.stdin.write(info.tobuf(format=tarfile.PAX_FORMAT))
    block = b"\0" * (1 << 20)
    for _ in range(size >> 20):
        zeros.stdin.write(block)
    zeros.stdin.write(b"\0" * 2048)
    zeros.stdin.close()
    reader.join()
    assert zeros.wait() == 0
    return chunks[0]


def test_decompression_bomb_is_refused(sqbox_bin, tmp_path):
    """4 GiB of zeros in a zstd layer of a few hundred KiB: past the 1100x expansion allowed.
    (gzip cannot expand more than ~1032x, so a gzip layer costs at most time, never memory.)"""
    need("zstd", "zstd")
    layer = zstd_tar_of_zeros("bomb", 4 << 30)
    layout = tmp_path / "layout"
    write_layout(layout, [layer], media_type="application/vnd.oci.image.layer.v1.tar+zstd")
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sqbox_bin, "import", f"oci:{layout}", "-o", str(out / "x.sqsh")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=300)
    assert result.returncode == 125, result.stderr
    assert "decompression bomb" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(out) == []


def test_compressed_archive_bomb_is_refused_before_it_fills_the_disk(sqbox_bin, tmp_path):
    """A docker-archive compressed with zstd holding 1 GiB of zeros in a member no manifest
    names: its members are copied out before the manifest is read, so the copy itself is bounded
    (1100x the archive's size), and nothing is left beside the output."""
    need("zstd", "zstd")
    archive = tmp_path / "bomb.tar.zst"
    archive.write_bytes(zstd_tar_of_zeros("padding", 1 << 30))
    assert archive.stat().st_size * 1100 < (1 << 30), archive.stat().st_size
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sqbox_bin, "import", f"docker-archive:{archive}", "-o",
                             str(out / "x.sqsh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=300)
    assert result.returncode == 125, result.stderr
    assert f"{archive}: decompresses to more than 1100 times its size; refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert os.listdir(out) == []


def test_symlinks_of_earlier_layers_stay_inside_the_image(sqbox_bin, sqbox, tmp_path):
    """A layer writes through a symlink an earlier layer planted towards the host: the file
    lands inside the image (as the layer means it), never on the host."""
    target = tmp_path / "host-dir"
    target.mkdir()
    layers = [
        gz_layer([(entry("bin/busybox", mode=0o755), Path(busybox_path()).read_bytes()),
                  (entry("bin/sh", tarfile.SYMTYPE, linkname="busybox"), None),
                  (entry("evil", tarfile.SYMTYPE, linkname=str(target)), None),
                  (entry("up", tarfile.SYMTYPE, linkname="../../../../.."), None)]),
        gz_layer([(entry("evil/planted"), b"through the link\n"),
                  (entry("up/escaped"), b"up and out\n")]),
    ]
    layout = tmp_path / "layout"
    write_layout(layout, layers)
    output = tmp_path / "out.sqsh"
    run([sqbox_bin, "import", f"oci:{layout}", "-o", str(output)])
    assert os.listdir(target) == []
    listing = subprocess.run(["unsquashfs", "-lln", str(output)], stdout=subprocess.PIPE,
                             text=True, check=True).stdout.split()
    assert f"squashfs-root{target}/planted" in listing
    result = sqbox.run(str(output), "/bin/busybox", "cat", "/escaped", "/up/escaped")
    assert result.stdout == "up and out\nup and out\n", result.stderr


def test_device_nodes_of_an_image_open_nothing(sqbox_bin, sqbox, tmp_path):
    layers = [gz_layer([
        (entry("bin/busybox", mode=0o755), Path(busybox_path()).read_bytes()),
        (entry("mem", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=1), None),
        (entry("dev/ignored", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=1), None)])]
    layout = tmp_path / "layout"
    write_layout(layout, layers)
    output = tmp_path / "out.sqsh"
    run([sqbox_bin, "import", f"oci:{layout}", "-o", str(output)])
    listing = subprocess.run(["unsquashfs", "-lln", str(output)], stdout=subprocess.PIPE,
                             text=True, check=True).stdout
    assert "squashfs-root/mem" in listing and "dev/ignored" not in listing
    result = sqbox.run(str(output), "/bin/busybox", "head", "-c", "1", "/mem")
    assert result.returncode != 0
    assert result.stdout == ""


def test_registry_import_without_libcurl_says_what_to_install(sqbox_bin, tmp_path):
    """libcurl is loaded only when a registry import needs it; on a host without it (a bare
    install, docs/install.md) the import fails with one line naming the package, not a crash."""
    need("unshare", "util-linux")
    libraries = run(["/sbin/ldconfig", "-p"]).stdout
    curls = sorted({line.split(" => ")[-1] for line in libraries.splitlines()
                    if line.split()[0] in ("libcurl.so.4", "libcurl-gnutls.so.4")})
    # Each libcurl the loader would find is hidden behind an empty file, in a mount namespace.
    script = "".join(f'mount --bind /dev/null "{path}" && ' for path in curls)
    script += 'exec "$0" import -o "$1" docker://localhost:1/library/debian:12'
    output = tmp_path / "out.sqsh"
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script,
                             sqbox_bin, str(output)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 125, result.stderr
    assert result.stderr.count("\n") == 1 and "need libcurl" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []

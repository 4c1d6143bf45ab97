"""The packages of scripts/package, installed where nothing of the build is: bare Debian root
filesystems made by mmdebstrap (minbase), in which the tarball and the .deb must install and run
a sandbox as an unprivileged user, and the wheel must pip-install offline into a virtual
environment whose client and `sqbox` command run sandboxes.

Needs root (mmdebstrap's root mode, dpkg in a chroot), mmdebstrap, bubblewrap and Debian's
archive. The root filesystems are cached as tarballs ($SQBOX_PACKAGE_TEST_CACHE, else
~/.cache/sqbox/package-tests), so reruns only unpack them. The packages come from
$SQBOX_PACKAGE_DIR when set (the output of an earlier scripts/package --wheel), else
scripts/package --wheel builds them in $SQBOX_PACKAGE_BUILD_DIR (default: the checkout's
build-package/).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import test_inputs  # noqa: E402  (needs the path above)

ROOT = test_inputs.ROOT
NOBODY = 65534
# What only glibc provides; anything else in the binary's NEEDED breaks "nothing but libc".
GLIBC_LIBRARIES = re.compile(r"^(libc\.so\.6|libm\.so\.6|ld-linux[-\w.]*\.so\.\d+|libgcc_s\.so\.1)$")


def require(condition, why):
    if not condition:
        pytest.skip(why)


@pytest.fixture(scope="module", autouse=True)
def prerequisites():
    require(os.geteuid() == 0, "installing into a root filesystem needs root (mmdebstrap, dpkg)")
    require(shutil.which("mmdebstrap"), "mmdebstrap is not installed (Debian: mmdebstrap)")
    require(shutil.which("bwrap"), "bubblewrap is not installed (Debian: bubblewrap)")
    require(shutil.which("setpriv"), "setpriv is not installed (Debian: util-linux)")


@pytest.fixture(scope="module")
def package_dir():
    """$SQBOX_PACKAGE_DIR, else where scripts/package --wheel puts what it builds now."""
    given = os.environ.get("SQBOX_PACKAGE_DIR")
    if given:
        return Path(given)
    build = os.environ.get("SQBOX_PACKAGE_BUILD_DIR", str(ROOT / "build-package"))
    directory = Path(build) / "dist"
    # The wheel is built with this Python's setuptools and wheel.
    subprocess.run([str(ROOT / "scripts" / "package"), "--build-dir", build, "--output",
                    str(directory), "--wheel"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, PYTHON=sys.executable))
    return directory


@pytest.fixture(scope="module")
def packages(package_dir):
    """(tarball, deb)"""
    directory = package_dir
    tarballs = sorted(directory.glob("sqbox-*.tar.gz"))
    debs = sorted(directory.glob("sqbox_*.deb"))
    assert len(tarballs) == 1 and len(debs) == 1, f"expected one tarball and one .deb in {directory}"
    return tarballs[0], debs[0]


@pytest.fixture(scope="module")
def version(packages):
    tarball, _ = packages
    match = re.fullmatch(r"sqbox-(.+)-[^-]+\.tar\.gz", tarball.name)
    assert match, tarball.name
    return match.group(1)


def cached_rootfs_tarball(suite, include=()):
    """A tarball of `mmdebstrap --variant=minbase SUITE` (plus INCLUDE), made once."""
    cache = Path(os.environ.get("SQBOX_PACKAGE_TEST_CACHE",
                                Path.home() / ".cache" / "sqbox" / "package-tests"))
    name = "-".join([suite, "minbase", *include]) + ".tar"
    tarball = cache / name
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / (name + ".partial.tar")
        command = ["mmdebstrap", "--quiet", "--mode=root", "--variant=minbase"]
        if include:
            command.append("--include=" + ",".join(include))
        result = subprocess.run([*command, suite, str(partial)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=1200)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            pytest.skip(f"mmdebstrap could not make a {suite} root filesystem (is Debian's "
                        f"archive reachable?): {result.stdout.strip()[-400:]}")
        partial.rename(tarball)
    return tarball


@pytest.fixture
def make_rootfs():
    """Unpacks a cached root filesystem into a fresh directory that the unprivileged user can
    reach; removed afterwards."""
    made = []

    def make(suite="bookworm", include=()):
        tarball = cached_rootfs_tarball(suite, include)
        holder = Path(tempfile.mkdtemp(prefix="package-test-rootfs."))
        made.append(holder)
        holder.chmod(0o755)
        rootfs = holder / "rootfs"
        rootfs.mkdir()
        subprocess.run(["tar", "-C", str(rootfs), "-xf", str(tarball)], check=True)
        return rootfs

    yield make
    for holder in made:
        shutil.rmtree(holder)


def in_chroot(rootfs, *command, check=True):
    """Runs COMMAND as root in ROOTFS (dpkg's job)."""
    return subprocess.run(["chroot", str(rootfs), *command], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300, check=check)


def as_nobody_in(rootfs, *command, image=None, offline=False):
    """Runs COMMAND in ROOTFS as an unprivileged user (nobody, no capabilities) through
    bubblewrap: the root filesystem, a fresh /proc, a minimal /dev with /dev/fuse, a tmpfs /tmp,
    and IMAGE at /image.sqsh; nothing else of the host (and, OFFLINE, not its network)."""
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp",
            "bwrap", "--unshare-user", "--bind", str(rootfs), "/", "--proc", "/proc",
            "--dev", "/dev", "--dev-bind", "/dev/fuse", "/dev/fuse", "--tmpfs", "/tmp"]
    if offline:
        argv.append("--unshare-net")
    if image is not None:
        (rootfs / "image.sqsh").touch()
        argv += ["--ro-bind", str(image), "/image.sqsh"]
    return subprocess.run([*argv, "--", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def needed_libraries(binary):
    dynamic = subprocess.run(["readelf", "-d", str(binary)], check=True, stdout=subprocess.PIPE,
                             text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)


def assert_runs_a_sandbox(rootfs, sqbox, version):
    """`sqbox --version` and a sandbox on the busybox image, run as nobody inside ROOTFS."""
    result = as_nobody_in(rootfs, sqbox, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sqbox {version}"

    # The answer comes from the image's busybox shell (the root filesystem has none), in a
    # sandbox of its own: pid 1 of a fresh pid namespace is sqbox's init, not bwrap.
    result = as_nobody_in(rootfs, sqbox, "run", "/image.sqsh", "--", "sh", "-c",
                          'echo "$((6 * 7)) $(readlink /bin/sh) $(id -u) $$"',
                          image=test_inputs.image("busybox"))
    assert result.returncode == 0, result.stderr
    answer, shell, uid, pid = result.stdout.split()
    assert answer == "42"
    assert shell.endswith("busybox") and not (rootfs / "bin" / "busybox").exists()
    assert uid == str(NOBODY)
    assert pid != "1" and int(pid) < 10, "the payload is not in a pid namespace of its own"


def test_the_binary_needs_nothing_but_glibc(packages, tmp_path):
    tarball, _ = packages
    subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
    (binary,) = tmp_path.glob("*/bin/sqbox")
    needed = needed_libraries(binary)
    assert needed, "expected a dynamically linked binary (glibc stays shared)"
    assert [name for name in needed if not GLIBC_LIBRARIES.match(name)] == []


def test_the_tarball_runs_a_sandbox_in_a_bare_debian(packages, version, make_rootfs):
    tarball, _ = packages
    rootfs = make_rootfs()
    # Libraries sqbox is built from that minbase lacks (it has nettle, libcap, libseccomp and
    # the compressors, for apt and dpkg): the binary carries them.
    for library in ("libfuse3.so*", "libsquashfuse*", "libsquashfs.so*", "libarchive.so*"):
        assert not list(rootfs.glob(f"usr/lib/*/{library}")), library
    subprocess.run(["tar", "-C", str(rootfs / "usr" / "local"), "--strip-components=1",
                    "-xzf", str(tarball)], check=True)
    assert_runs_a_sandbox(rootfs, "/usr/local/bin/sqbox", version)

    # The enroot front end, by the name enroot, through the link the tarball ships.
    result = as_nobody_in(rootfs, "/usr/local/libexec/sqbox/enroot", "version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() != "" and "sqbox" not in result.stdout
    # No libcurl in minbase: a registry import says what to install, in one line, and leaves
    # nothing behind.
    result = as_nobody_in(rootfs, "sh", "-c", "cd /tmp && sqbox import -o out.sqsh "
                          "docker://localhost:1/library/debian:12; echo status=$?; ls -A")
    assert result.stdout.split() == ["status=125"], result.stdout
    assert result.stderr.count("\n") == 1 and "need libcurl" in result.stderr, result.stderr
    assert (rootfs / "usr/local/share/sqbox/apparmor/sqbox").is_file()
    assert (rootfs / "usr/local/share/doc/sqbox/README.md").is_file()


def test_the_deb_installs_with_dpkg_and_runs_a_sandbox(packages, version, make_rootfs):
    _, deb = packages
    rootfs = make_rootfs()
    shutil.copy(deb, rootfs / "tmp" / deb.name)
    result = in_chroot(rootfs, "dpkg", "-i", f"/tmp/{deb.name}", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    status = in_chroot(rootfs, "dpkg-query", "-W", "-f=${Status} ${Version}", "sqbox").stdout
    assert status == f"install ok installed {version}"

    listed = set(in_chroot(rootfs, "dpkg", "-L", "sqbox").stdout.split())
    for path in ("/usr/bin/sqbox", "/usr/libexec/sqbox/enroot", "/etc/apparmor.d/sqbox",
                 "/usr/share/doc/sqbox/README.md", "/usr/share/doc/sqbox/SECURITY.md",
                 "/usr/share/doc/sqbox/docs/run.md"):
        assert path in listed, path
    assert os.readlink(rootfs / "usr/libexec/sqbox/enroot") == "../../bin/sqbox"
    conffiles = in_chroot(rootfs, "dpkg-query", "-W", "-f=${Conffiles}", "sqbox").stdout
    assert "/etc/apparmor.d/sqbox" in conffiles
    # No AppArmor here at all: the profile is kept out of a later boot-time load.
    assert os.readlink(rootfs / "etc/apparmor.d/disable/sqbox") == "../sqbox"

    assert_runs_a_sandbox(rootfs, "/usr/bin/sqbox", version)

    result = in_chroot(rootfs, "dpkg", "--purge", "sqbox", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in ("usr/bin/sqbox", "usr/libexec/sqbox", "etc/apparmor.d"):
        assert not os.path.lexists(rootfs / path), path


def test_on_debian_12_apparmor_the_profile_is_disabled_not_broken(packages, make_rootfs):
    """AppArmor 3 (Debian 12) cannot parse the `userns` rule: loading /etc/apparmor.d as the boot
    does must still succeed after the install."""
    _, deb = packages
    rootfs = make_rootfs("bookworm", ("apparmor",))
    load_all = ("apparmor_parser", "--skip-kernel-load", "--skip-cache", "/etc/apparmor.d")
    before = in_chroot(rootfs, *load_all, check=False)
    assert before.returncode == 0, before.stderr

    shutil.copy(deb, rootfs / "tmp" / deb.name)
    result = in_chroot(rootfs, "dpkg", "-i", f"/tmp/{deb.name}", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert os.readlink(rootfs / "etc/apparmor.d/disable/sqbox") == "../sqbox"
    after = in_chroot(rootfs, *load_all, check=False)
    assert after.returncode == 0, after.stderr
    # ...because of that link: without it this parser refuses the profile.
    os.unlink(rootfs / "etc/apparmor.d/disable/sqbox")
    assert in_chroot(rootfs, *load_all, check=False).returncode != 0


def test_apparmor_4_parses_the_profile_and_the_package_keeps_it_enabled(packages, make_rootfs):
    """AppArmor 4 (Debian 13; Ubuntu 23.10+ has the same parser) compiles the profile, `userns`
    rule and all, and the postinst leaves it enabled."""
    _, deb = packages
    rootfs = make_rootfs("trixie", ("apparmor",))
    shutil.copy(deb, rootfs / "tmp" / deb.name)
    result = in_chroot(rootfs, "dpkg", "-i", f"/tmp/{deb.name}", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not os.path.lexists(rootfs / "etc/apparmor.d/disable/sqbox")
    parsed = in_chroot(rootfs, "apparmor_parser", "--skip-kernel-load", "--skip-cache",
                       "/etc/apparmor.d/sqbox", check=False)
    assert parsed.returncode == 0, parsed.stderr
    # The profile that was compiled is the one that names sqbox and allows user namespaces.
    expanded = in_chroot(rootfs, "apparmor_parser", "--preprocess", "/etc/apparmor.d/sqbox").stdout
    assert re.search(r"profile sqbox /usr/\{,local/\}bin/sqbox flags=\(unconfined\)", expanded)
    assert re.search(r"^\s*userns,", expanded, re.MULTILINE)


# ---------------------------------------------------------------------------------------------
# The wheel: the Python client with the binary in it

WHEEL_NAME = re.compile(r"sqbox-(?P<version>[^-]+)-py3-none-manylinux_(?P<glibc>\d+_\d+)_"
                        r"(?P<arch>\w+)\.whl")
# Python and venv, as a harness's machine has them; nothing of sqbox's build.
PYTHON_ONLY = ("python3", "python3-venv")


@pytest.fixture(scope="module")
def wheel(package_dir):
    wheels = sorted(package_dir.glob("sqbox-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {package_dir}: {wheels}"
    return wheels[0]


def newest_glibc_version(binary):
    symbols = subprocess.run(["readelf", "--dyn-syms", "--wide", str(binary)], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    versions = re.findall(r"@GLIBC_(\d+(?:\.\d+)+)", symbols)
    return max(versions, key=lambda v: tuple(int(part) for part in v.split(".")))


def test_the_wheel_is_tagged_for_the_glibc_and_machine_its_binary_needs(packages, version, wheel,
                                                                        tmp_path):
    match = WHEEL_NAME.fullmatch(wheel.name)
    assert match, wheel.name
    assert match["version"] == version and match["arch"] == os.uname().machine
    tarball, _ = packages
    subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
    (tarball_binary,) = tmp_path.glob("*/bin/sqbox")
    assert match["glibc"] == newest_glibc_version(tarball_binary).replace(".", "_")

    with zipfile.ZipFile(wheel) as archive:
        entry = archive.getinfo("sqbox/_bin/sqbox")
        assert (entry.external_attr >> 16) & 0o777 == 0o755
        # The tarball's binary, byte for byte.
        assert archive.read(entry) == tarball_binary.read_bytes()
        dist_info = f"sqbox-{version}.dist-info"
        tags = archive.read(f"{dist_info}/WHEEL").decode()
        assert f"Tag: py3-none-manylinux_{match['glibc']}_{match['arch']}" in tags.splitlines()
        scripts = archive.read(f"{dist_info}/entry_points.txt").decode()
        assert re.search(r"^\[console_scripts\]\nsqbox = sqbox\._command:main$", scripts,
                         re.MULTILINE), scripts


def test_the_wheel_installs_offline_into_a_venv_and_runs_sandboxes(wheel, version, make_rootfs):
    rootfs = make_rootfs("bookworm", PYTHON_ONLY)
    # Nothing of the build, and no other sqbox, for the client to find.
    assert not list(rootfs.glob("usr/bin/*gcc*")) and not list(rootfs.glob("usr/bin/cmake"))
    for library in ("libfuse3.so*", "libsquashfuse*", "libsquashfs.so*", "libarchive.so*"):
        assert not list(rootfs.glob(f"usr/lib/*/{library}")), library
    assert not list(rootfs.glob("usr/*bin/sqbox")) and not list(rootfs.glob("usr/local/*/sqbox"))
    home = rootfs / "home" / "user"
    home.mkdir(parents=True)
    os.chown(home, NOBODY, NOBODY)
    shutil.copy(wheel, home / wheel.name)

    def as_nobody(*command):
        return as_nobody_in(rootfs, *command, image=test_inputs.image("busybox"), offline=True)

    result = as_nobody("cat", "/proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
    assert interfaces == ["lo"], "the installation is not offline"

    result = as_nobody("python3", "-m", "venv", "/home/user/venv")
    assert result.returncode == 0, result.stdout + result.stderr
    result = as_nobody("/home/user/venv/bin/pip", "install", "--no-index", "--quiet",
                       f"/home/user/{wheel.name}")
    assert result.returncode == 0, result.stdout + result.stderr
    (installed,) = home.glob("venv/lib/python3*/site-packages/sqbox/_bin/sqbox")
    assert installed.stat().st_mode & 0o777 == 0o755

    # The client finds the binary it carries, and runs sandboxes with it: one `sqbox run`, and a
    # `sqbox serve` with one run.
    client = textwrap.dedent("""
        import sqbox
        print(sqbox.find_binary())
        print(sqbox.run("/image.sqsh", ["sh", "-c", "echo $((6 * 7)) $(id -u)"]).stdout, end="")
        with sqbox.Sandbox("/image.sqsh") as sandbox:
            print(sandbox.run(["sh", "-c", "echo served $(readlink /bin/sh)"]).stdout, end="")
    """)
    result = as_nobody("/home/user/venv/bin/python", "-c", client)
    assert result.returncode == 0, result.stderr
    found, answer, served = result.stdout.splitlines()
    assert found == "/" + str(installed.relative_to(rootfs))
    assert answer == f"42 {NOBODY}"
    assert served.startswith("served ") and served.endswith("busybox")

    # The `sqbox` command, as an activated environment puts it on PATH.
    def in_venv(command):
        return as_nobody("sh", "-c", ". /home/user/venv/bin/activate && " + command)

    result = in_venv("command -v sqbox && sqbox --version && sqbox run /image.sqsh echo hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["/home/user/venv/bin/sqbox", f"sqbox {version}", "hi"]
    # A failing payload's status comes through the command unchanged.
    result = in_venv("sqbox run /image.sqsh -- sh -c 'exit 3'")
    assert result.returncode == 3, result.stderr

    # The enroot front end: `sqbox enroot`, or the command under the name enroot.
    by_subcommand = in_venv("sqbox enroot version")
    assert by_subcommand.returncode == 0, by_subcommand.stderr
    assert by_subcommand.stdout.strip() != "" and "sqbox" not in by_subcommand.stdout
    (home / "bin").mkdir()
    (home / "bin" / "enroot").symlink_to("../venv/bin/sqbox")
    by_name = in_venv("PATH=/home/user/bin:$PATH enroot version")
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == by_subcommand.stdout

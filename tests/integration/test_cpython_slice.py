"""A slice of CPython's own test suite passes inside `sqbox run` as it does outside.

The same Python (Debian's python3.11 on the host; the python_testsuite image has the same
packages) runs the same test modules as the same user, outside and inside a sandbox with the
default options, side by side. Every module that passes outside must pass inside; the
differences are printed test by test.

A few test cases depend on what no rootless sandbox can give; both runs leave them out, and
IGNORED (and IGNORED_AS_ROOT) say why (docs/run.md, "Differences worth knowing").
"""
import os
import pwd
import re
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

import test_inputs

SLICE = ["test_os", "test_subprocess", "test_threading", "test_mmap", "test_tempfile",
         "test_select", "test_selectors", "test_fcntl", "test_posix", "test_pty", "test_resource",
         "test_asyncio.test_subprocess", "test_shutil", "test_pathlib", "test_glob", "test_io"]

# The sandbox's user namespace maps one uid and one gid: the kernel answers EINVAL (outside:
# EPERM) for any other id, and root inside has no capabilities.
_UNMAPPED_IDS = "ids other than the sandbox's are unmapped in its user namespace"
IGNORED = {
    "test.test_subprocess.POSIXProcessTestCase.test_user": _UNMAPPED_IDS,
    "test.test_subprocess.POSIXProcessTestCase.test_group": _UNMAPPED_IDS,
    "test.test_subprocess.POSIXProcessTestCase.test_extra_groups": _UNMAPPED_IDS,
    "test.test_os.ChownFileTests.test_chown_without_permission": _UNMAPPED_IDS,
    "test.test_os.ChownFileTests.test_chown_with_root": _UNMAPPED_IDS,
}
# Run as root, the tests also expect root's powers over other ids, which root inside a sandbox
# (uid 0 of a user namespace that maps nothing else, without capabilities) does not have.
_NOT_REAL_ROOT = "root inside has no capabilities, setgroups is denied and other ids are unmapped"
IGNORED_AS_ROOT = {
    "test.test_posix.PosixGroupsTester.*": _NOT_REAL_ROOT,
    "test.test_posix.PosixTester.test_chown": _NOT_REAL_ROOT,
    "test.test_posix.PosixTester.test_fchown": _NOT_REAL_ROOT,
    "test.test_posix.PosixTester.test_lchown": _NOT_REAL_ROOT,
}

REGRTEST = Path("/usr/lib/python3.11/test/regrtest.py")
# regrtest's line per module in parallel mode: "[ 3/16/1] test_os failed (1 error)".
MODULE_LINE = re.compile(r"\[\s*\d+/\d+(?:/\d+)?\] (test\S*) (passed|failed|skipped|crashed|"
                         r"timed out|resource denied|ran no tests|interrupted|env changed)")


def ignored():
    return {**IGNORED, **(IGNORED_AS_ROOT if os.geteuid() == 0 else {})}


def regrtest_argv(junit_xml):
    ignores = [arg for test in ignored() for arg in ("--ignore", test)]
    return ["python3", "-m", "test", "-j4", "--junit-xml", junit_xml, *ignores, *SLICE]


def module_results(output):
    return {m.group(1): m.group(2) for m in MODULE_LINE.finditer(output)}


def failed_cases(junit_xml):
    """Test case id -> first line of its failure or error, from regrtest's JUnit file."""
    if not junit_xml.exists():
        return {}
    failed = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                failed[case.get("name")] = (child.get("message") or child.tag).splitlines()[0]
    return failed


@pytest.fixture(scope="module")
def testsuite_image():
    if not REGRTEST.is_file():
        pytest.skip("CPython's tests are not installed on the host: install "
                    "libpython3.11-testsuite (scripts/install-deps does)")
    return test_inputs.image("python_testsuite")


def test_the_cpython_slice_passes_inside_as_outside(sqbox_bin, testsuite_image, tmp_path):
    name = pwd.getpwuid(os.geteuid()).pw_name
    version = [sqbox_bin, "run", testsuite_image, "--", "python3", "-c",
               "import sys; print(sys.version)"]
    inside_version = subprocess.run(version, stdout=subprocess.PIPE, text=True, timeout=60)
    outside_version = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version)"],
                                     stdout=subprocess.PIPE, text=True, timeout=60)
    assert inside_version.stdout == outside_version.stdout, (
        "the host's Python and the python_testsuite image's differ; rebuild the image "
        "(images/build python_testsuite) or update the host (scripts/install-deps)")

    outside_dir = tmp_path / "outside"
    inside_dir = tmp_path / "inside"
    home = tmp_path / "home"
    for directory in (outside_dir, inside_dir, home):
        directory.mkdir()
    # The outside run gets what the sandbox's payload gets: a plain environment and its user.
    outside_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(home),
                   "USER": name, "LOGNAME": name}
    outside = subprocess.Popen(regrtest_argv(str(outside_dir / "results.xml")), cwd=outside_dir,
                               env=outside_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    inside = subprocess.Popen(
        [sqbox_bin, "run", "--mount", f"{inside_dir}:/results", "--workdir", "/tmp",
         testsuite_image, "--", *regrtest_argv("/results/results.xml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outside_output, _ = outside.communicate(timeout=900)
    inside_output, _ = inside.communicate(timeout=900)

    outside_modules = module_results(outside_output)
    inside_modules = module_results(inside_output)
    assert outside_modules, f"no module results outside:\n{outside_output[-3000:]}"
    passed_outside = [m for m in SLICE if outside_modules.get(m) == "passed"]
    # Not a skip: the comparison needs modules that pass outside to mean anything.
    assert len(passed_outside) >= len(SLICE) - 2, f"outside: {outside_modules}"

    differences = [f"{m}: outside {outside_modules.get(m)}, inside {inside_modules.get(m)}"
                   for m in passed_outside if inside_modules.get(m) != "passed"]
    outside_failed = failed_cases(outside_dir / "results.xml")
    cases = [f"  {case}: {message}"
             for case, message in sorted(failed_cases(inside_dir / "results.xml").items())
             if case not in outside_failed]
    report = "\n".join(differences + ["test cases that fail only inside:"] + cases)
    print(f"modules outside: {outside_modules}\nmodules inside: {inside_modules}\n{report}")
    assert not differences, f"differences inside the sandbox:\n{report}\n" \
                            f"--- inside's output (end):\n{inside_output[-4000:]}"

"""/proc masking: the kernel-wide files of /proc that leak host state or reconfigure the host."""
import os

import pytest

MASKED = ["/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/timer_list",
          "/proc/sched_debug", "/proc/latency_stats", "/proc/timer_stats", "/proc/kmsg",
          "/proc/acpi", "/proc/scsi"]


def test_sensitive_proc_files_are_masked(box):
    """Each is absent, empty, or unreadable: never the host's content. A masked directory cannot
    be filled in either (it is read-only, even for uid 0 with --root)."""
    result, res = box.py_results("""
        for path in sys.argv[2:]:
            if os.path.isdir(path):
                try:
                    RESULTS[path] = os.listdir(path)
                except OSError as e:
                    RESULTS[path] = ename(e.errno)
                attempt(path + "/created", os.mkdir, path + "/created")
                continue
            try:
                with open(path, "rb") as f:
                    RESULTS[path] = len(f.read(65536))
            except OSError as e:
                RESULTS[path] = ename(e.errno)
        finish()
    """, *MASKED)
    for path in MASKED:
        assert res[path] in (0, [], "ENOENT", "EACCES", "EPERM"), (path, res[path])
        if path + "/created" in res:
            assert res[path + "/created"] in ("EROFS", "EACCES", "EPERM"), res


def test_kallsyms_reveals_no_kernel_addresses(box):
    result, res = box.py_results("""
        try:
            lines = open("/proc/kallsyms").read().splitlines()
        except OSError as e:
            finish(error=ename(e.errno))
        else:
            nonzero = [l for l in lines if int(l.split()[0], 16) != 0]
            finish(lines=len(lines), nonzero=nonzero[:5])
    """)
    if "error" in res:
        assert res["error"] in ("EACCES", "EPERM", "ENOENT"), res
    else:
        assert res["nonzero"] == [], res


def test_sysrq_trigger_and_proc_sys_are_read_only(box):
    """Writes to /proc/sysrq-trigger and /proc/sys fail (each written value is the current one,
    or a harmless help request, so that nothing changes even if a write went through), and the
    mounts are read-only. The host's core_pattern is unchanged."""
    with open("/proc/sys/kernel/core_pattern") as f:
        core_pattern = f.read()
    result, res = box.py_results("""
        def rewrite(path):
            value = open(path, "rb").read()
            with open(path, "wb") as f:
                f.write(value)
        def write(path, data):
            with open(path, "wb") as f:
                f.write(data)
        attempt("sysrq_trigger", write, "/proc/sysrq-trigger", b"h")
        for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname",
                     "/proc/sys/kernel/domainname", "/proc/sys/kernel/modprobe",
                     "/proc/sys/net/ipv4/ip_forward", "/proc/sys/vm/overcommit_memory",
                     "/proc/sys/fs/pipe-max-size", "/proc/sys/user/max_user_namespaces"):
            attempt(path, rewrite, path)
        mounts = {}
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            mounts[fields[4]] = fields[5].split(",")[0]
        finish(mounts=mounts)
    """)
    # ENOENT: a kernel without magic SysRq has no trigger file
    assert res.pop("sysrq_trigger") in ("EROFS", "EACCES", "EPERM", "ENOENT"), res
    mounts = res.pop("mounts")
    for path, outcome in res.items():
        # ENOENT: an entry this kernel shows only in its initial user namespace
        assert outcome in ("EROFS", "EACCES", "EPERM", "ENOENT"), (path, outcome)
    assert res["/proc/sys/kernel/core_pattern"] != "ENOENT", res
    assert mounts.get("/proc/sys") == "ro", mounts
    if os.path.exists("/proc/sysrq-trigger"):
        assert mounts.get("/proc/sysrq-trigger") == "ro", mounts
    with open("/proc/sys/kernel/core_pattern") as f:
        assert f.read() == core_pattern


@pytest.mark.parametrize("path", ["/proc/irq", "/proc/bus", "/proc/fs"])
def test_proc_kernel_directories_are_read_only(box, path):
    if not os.path.isdir(path):  # a fresh procfs has the same kernel-wide entries as the host's
        pytest.skip(f"this kernel has no {path}")
    result, res = box.py_results("""
        path = sys.argv[2]
        mounts = {}
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            mounts[fields[4]] = fields[5].split(",")[0]
        finish(exists=os.path.exists(path), mode=mounts.get(path))
    """, path)
    assert res == {"exists": True, "mode": "ro"}, res


def test_host_global_sysctls_cannot_be_changed(box):
    """A global (not namespaced) sysctl written with a different, harmless value: the host's
    value stays. (Where sqbox runs as host root the sandbox user is host uid 0, which sysctl's
    permission check lets write unless /proc/sys is read-only; core_pattern or modprobe written
    the same way would run a program as real root.)"""
    path = "/proc/sys/kernel/printk_ratelimit"
    with open(path) as f:
        before = f.read()
    try:
        result, res = box.py_results("""
            path = sys.argv[2]
            value = int(open(path).read()) + 1
            def write():
                with open(path, "w") as f:
                    f.write(str(value))
            attempt("write", write)
            finish()
        """, path)
    finally:
        with open(path) as f:
            after = f.read()
        if after != before:  # undo it, then report
            with open(path, "w") as f:
                f.write(before)
    assert after == before, f"the payload changed the host's {path}"
    assert res["write"] in ("EROFS", "EACCES", "EPERM"), res

"""Docker's default seccomp profile compiled to a BPF program, as Docker applies it, for the pod
harness's outer container (bubblewrap loads a compiled program: `bwrap --seccomp FD`).

Compiled here with libseccomp through ctypes, independently of sqbox's own profile compiler,
following moby's rules (profiles/seccomp/seccomp.go): a rule is left out when the architecture
or a capability of the container's bounding set is among its `excludes`, or when its `includes`
name an architecture other than this one or a capability the bounding set lacks; arguments that
name one index more than once become one rule each (libseccomp cannot AND two conditions on one
argument); names libseccomp does not know are skipped, as Docker skips them.
"""
import ctypes
import ctypes.util
import json
import os
import platform

# Docker's default capability set: the bounding set of a container started without --cap-add.
# A non-root process in it has none of them effective, but Docker decides the profile's
# capability-dependent rules by this set (so chroot is allowed, clone of namespaces is not).
DOCKER_DEFAULT_CAPABILITIES = {
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_NATIVE = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}
_OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
        "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _kernel_at_least(version):
    want = tuple(int(part) for part in version.split("."))
    have = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:len(want)])
    return have >= want


def _library():
    name = ctypes.util.find_library("seccomp")
    if not name:
        return None
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def available():
    return _library() is not None


def _action(name, errno_ret, default_errno):
    if name == "SCMP_ACT_ALLOW":
        return 0x7FFF0000
    if name == "SCMP_ACT_ERRNO":
        return 0x00050000 | ((errno_ret if errno_ret is not None else default_errno) & 0xFFFF)
    if name == "SCMP_ACT_KILL":
        return 0x00000000
    if name == "SCMP_ACT_LOG":
        return 0x7FFC0000
    raise ValueError(f"action {name} not handled by the harness")


def _applies(rule, arch, caps):
    excludes = rule.get("excludes") or {}
    includes = rule.get("includes") or {}
    if arch in excludes.get("arches", []):
        return False
    if any(cap in caps for cap in excludes.get("caps", [])):
        return False
    if excludes.get("minKernel") and _kernel_at_least(excludes["minKernel"]):
        return False
    if includes.get("arches") and arch not in includes["arches"]:
        return False
    if any(cap not in caps for cap in includes.get("caps", [])):
        return False
    if includes.get("minKernel") and not _kernel_at_least(includes["minKernel"]):
        return False
    return True


def _argument_sets(args):
    """One list of conditions per rule: all of them, or one each when an index repeats."""
    if not args:
        return [[]]
    indexes = [arg["index"] for arg in args]
    conditions = [_ArgCmp(arg["index"], _OPS[arg["op"]], arg["value"], arg.get("valueTwo", 0))
                  for arg in args]
    if len(set(indexes)) == len(indexes):
        return [conditions]
    return [[condition] for condition in conditions]


def compile_profile(profile_path, out_fd, caps=DOCKER_DEFAULT_CAPABILITIES):
    """Writes the BPF program of the Docker profile at `profile_path` to `out_fd`."""
    lib = _library()
    assert lib is not None, "libseccomp (package libseccomp2) is needed to compile the profile"
    machine = platform.machine()
    arch = _GOARCH[machine]
    with open(profile_path) as f:
        profile = json.load(f)
    default_errno = profile.get("defaultErrnoRet", 1)
    ctx = lib.seccomp_init(_action(profile["defaultAction"], None, default_errno))
    assert ctx, "seccomp_init failed"
    try:
        for entry in profile.get("archMap", []):
            if entry["architecture"] != _NATIVE[machine]:
                continue
            for sub in entry.get("subArchitectures", []):
                token = lib.seccomp_arch_resolve_name(sub[len("SCMP_ARCH_"):].lower().encode())
                assert token != 0, sub
                rc = lib.seccomp_arch_add(ctx, token)
                assert rc in (0, -17), f"seccomp_arch_add({sub}): {rc}"  # -EEXIST: native
        for rule in profile["syscalls"]:
            if not _applies(rule, arch, caps):
                continue
            action = _action(rule["action"], rule.get("errnoRet"), default_errno)
            for name in rule["names"]:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number < 0:  # __NR_SCMP_ERROR: unknown to this libseccomp
                    continue
                for conditions in _argument_sets(rule.get("args")):
                    array = (_ArgCmp * len(conditions))(*conditions)
                    rc = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
                    # -EEXIST/-EACCES: a rule that repeats the default action or another rule.
                    assert rc in (0, -17, -13), f"seccomp_rule_add({name}): {os.strerror(-rc)}"
        rc = lib.seccomp_export_bpf(ctx, out_fd)
        assert rc == 0, f"seccomp_export_bpf: {os.strerror(-rc)}"
    finally:
        lib.seccomp_release(ctx)

#include "runtime/host_checks.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <sstream>

#include "image/image_source.h"
#include "image/squashfuse_api.h"
#include "runtime/cgroups.h"
#include "security/landlock.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// The kernel sqbox needs: the fd-based mount API with mount_setattr (README, "Requirements").
constexpr unsigned kMinimumKernelMajor = 5;
constexpr unsigned kMinimumKernelMinor = 12;

constexpr const char* kNoSandbox = "refuses to run: every sandbox is built in a user namespace";

constexpr const char* kSeccompFix =
    "let the container create namespaces: in Kubernetes the pod's "
    "securityContext.seccompProfile.type: Unconfined (or a Localhost profile that allows clone, "
    "clone3 and unshare with CLONE_NEWUSER and the other namespace flags); in Docker "
    "--security-opt seccomp=unconfined";

// Where the package installs sqbox's AppArmor profile (packaging/apparmor/sqbox).
constexpr const char* kInstalledProfile = "/etc/apparmor.d/sqbox";

constexpr const char* kAppArmorProfileFix =
    "install sqbox's AppArmor profile as /etc/apparmor.d/sqbox (the package ships it) and load "
    "it: sudo apparmor_parser -r /etc/apparmor.d/sqbox; or lift the restriction for everyone: "
    "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0";

HostCheck check_kernel(const KernelRelease& kernel) {
    HostCheck check{"kernel", CheckStatus::kOk, "Linux " + kernel.release, "", ""};
    const bool recent_enough =
        kernel.major > kMinimumKernelMajor ||
        (kernel.major == kMinimumKernelMajor && kernel.minor >= kMinimumKernelMinor);
    if (recent_enough) {
        check.action = "uses the fd-based mount API (Linux >= 5.12)";
        return check;
    }
    check.status = CheckStatus::kMissing;
    check.action = "refuses to run: it needs the fd-based mount API and mount_setattr";
    check.fix = "a Linux kernel 5.12 or later";
    return check;
}

HostCheck check_seccomp(const ProbeResult& probe, std::optional<int> own_mode) {
    HostCheck check{"seccomp", CheckStatus::kOk, "seccomp filters can be installed", "", ""};
    if (probe.ok) {
        check.action = "confines the payload with its seccomp filter (--seccomp)";
        if (own_mode == 2) {
            check.found +=
                "; sqbox itself runs under a seccomp filter (Seccomp: 2 in /proc/self/status, a "
                "container's profile), which stays in force beneath the sandbox's";
        }
        return check;
    }
    check.status = CheckStatus::kMissing;
    check.found = probe.message;
    check.action = "refuses to run with a seccomp profile (only --seccomp none would run)";
    check.fix = "a kernel built with CONFIG_SECCOMP_FILTER=y";
    return check;
}

HostCheck check_fuse(const ProbeResult& probe) {
    HostCheck check{"fuse", CheckStatus::kOk, "/dev/fuse opens for reading and writing",
                    "serves .sqsh images itself over FUSE", ""};
    if (probe.ok) return check;
    check.status = CheckStatus::kDegraded;
    check.found = probe.message;
    check.action =
        "unpacks the image once into the cache (per user) and runs from there; directory images "
        "need no FUSE";
    check.fix =
        "give the container /dev/fuse: in Kubernetes a FUSE device plugin (the pod requests its "
        "resource in resources.limits) or the device in the pod spec; in Docker --device "
        "/dev/fuse; on a host, modprobe fuse and make /dev/fuse mode 0666";
    return check;
}

HostCheck check_cgroup(const DoctorOptions& options) {
    SandboxConfig config;
    config.cgroup_parent = options.cgroup_parent;
    const std::string where =
        options.cgroup_parent.empty() ? std::string() : " in --cgroup " + options.cgroup_parent;
    HostCheck check{"cgroup", CheckStatus::kOk, "", "", ""};
    std::optional<SandboxCgroup> cgroup;
    try {
        // Made and removed again, as a run does: a hierarchy can look usable and still refuse
        // (read-only in a container).
        cgroup = SandboxCgroup::plan(config);
        if (cgroup) cgroup->create();
    } catch (const Error& e) {
        check.status = CheckStatus::kMissing;
        check.found = e.what();
        check.action = "refuses to run: the cgroup it would use cannot hold the sandbox";
        check.fix = options.cgroup_parent.empty()
                        ? "make the cgroup hierarchy writable for sqbox (as root: the memory and "
                          "pids controllers enabled in cgroup.subtree_control), or pass --cgroup "
                          "DIR, a cgroup v2 directory delegated to you"
                        : "pass a cgroup v2 directory delegated to you (writable cgroup.procs "
                          "and cgroup.subtree_control) that holds no processes of its own";
        return check;
    }
    if (cgroup) {
        check.found = "a " + cgroup->mechanism() + " cgroup for each sandbox" + where;
        check.action = "limits --memory and --pids for the whole sandbox in its own cgroup";
        return check;
    }
    check.status = CheckStatus::kDegraded;
    const bool root = ::geteuid() == 0;
    check.found = root ? "no cgroup v2 with the memory and pids controllers, and no cgroup v1 "
                         "memory and pids hierarchies"
                       : "no cgroup: only root's runs find one themselves, and no --cgroup was "
                         "given";
    check.action = root ? "falls back to rlimits: --memory per process (RLIMIT_DATA, RLIMIT_AS); "
                          "--pids is not enforced (the kernel exempts root from RLIMIT_NPROC); "
                          "--cpus is refused"
                        : "falls back to rlimits: --memory per process (RLIMIT_DATA, RLIMIT_AS), "
                          "--pids as RLIMIT_NPROC in the sandbox's user namespace; --cpus is "
                          "refused";
    check.fix = root ? "mount cgroup v2 with the memory and pids controllers enabled"
                     : "pass --cgroup DIR, a cgroup v2 directory delegated to you that holds no "
                       "processes of its own (systemd-run --user -p Delegate=yes makes one; "
                       "see docs/doctor.md)";
    return check;
}

HostCheck check_landlock(int abi) {
    HostCheck check{"landlock", CheckStatus::kOk, "Landlock ABI " + std::to_string(abi),
                    "confines the payload's file access to the sandbox's root with Landlock", ""};
    if (abi > 0) {
        if (abi < 6) {
            check.found +=
                " (before ABI 6 Landlock does not scope signals and abstract sockets; the "
                "sandbox's pid and network namespaces still do)";
        }
        return check;
    }
    check.status = CheckStatus::kDegraded;
    check.found = "no Landlock (not built in, or not in the kernel's lsm= list)";
    check.action = "runs without Landlock: the mount namespace alone keeps host files out of reach";
    check.fix = "a kernel (>= 5.13) with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm=";
    return check;
}

const char* compression_name(unsigned id) {
    switch (id) {
        case ZLIB_COMPRESSION:
            return "gzip";
        case LZMA_COMPRESSION:
            return "lzma";
        case LZO_COMPRESSION:
            return "lzo";
        case XZ_COMPRESSION:
            return "xz";
        case LZ4_COMPRESSION:
            return "lz4";
        case ZSTD_COMPRESSION:
            return "zstd";
        default:
            return "unknown";
    }
}

HostCheck check_image(const std::string& given, bool fuse_usable) {
    HostCheck check{"image", CheckStatus::kOk, "", "", ""};
    std::error_code ec;
    const std::filesystem::path path = std::filesystem::absolute(given, ec);
    try {
        if (ec) throw Error("image " + given + ": " + ec.message());
        const ImageSource image = open_image(path.lexically_normal().string());
        if (image.kind == ImageSource::Kind::kDirectory) {
            check.found = image.path + ": a directory";
            check.action = "binds it read-only as the sandbox's image (no FUSE needed)";
            return check;
        }
        const squashfs_super_block& sb = image.squashfs->fs.sb;
        check.found = image.path + ": squashfs 4." + std::to_string(sb.s_minor) + ", " +
                      std::to_string(sb.inodes) + " inodes, " + std::to_string(sb.bytes_used) +
                      " bytes, " + compression_name(sb.compression) + ", " +
                      std::to_string(sb.block_size / 1024) + " KiB blocks";
        check.action = fuse_usable ? "serves it over FUSE"
                                   : "unpacks it once into the cache (no /dev/fuse) and runs "
                                     "from there";
        return check;
    } catch (const Error& e) {
        check.status = CheckStatus::kMissing;
        check.found = e.what();
        check.action = "refuses the image (sqbox run exits 125)";
        check.fix =
            "give a squashfs image (enroot's .sqsh; sqbox import makes one) or a directory "
            "holding a root filesystem";
        return check;
    }
}

HostCheck skipped(const char* name) {
    return {name, CheckStatus::kSkipped, "not tried: it needs a user namespace",
            "cannot tell before user namespaces work", "the fix of user_namespaces"};
}

bool profile_for_sqbox_loaded(const UserNamespaceFacts& facts) {
    return std::any_of(facts.apparmor_profiles.begin(), facts.apparmor_profiles.end(),
                       [&](const AppArmorProfile& profile) {
                           return profile.name == "sqbox" || profile.name == facts.executable;
                       });
}

}  // namespace

const char* check_status_name(CheckStatus status) {
    switch (status) {
        case CheckStatus::kOk:
            return "ok";
        case CheckStatus::kDegraded:
            return "degraded";
        case CheckStatus::kMissing:
            return "missing";
        case CheckStatus::kSkipped:
            return "skipped";
    }
    return "missing";
}

UserNamespaceFacts gather_user_namespace_facts() {
    UserNamespaceFacts facts;
    facts.probe = probe_user_namespace();
    facts.max_user_namespaces = read_sysctl("user/max_user_namespaces");
    facts.unprivileged_userns_clone = read_sysctl("kernel/unprivileged_userns_clone");
    facts.apparmor_restrict = read_sysctl("kernel/apparmor_restrict_unprivileged_userns");
    facts.apparmor_label = own_apparmor_label();
    facts.apparmor_profiles = loaded_apparmor_profiles();
    facts.installed_profile = read_small_file(kInstalledProfile);
    facts.seccomp_mode = own_seccomp_mode();
    facts.root = host_root();
    std::error_code ec;
    facts.executable = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    return facts;
}

namespace {

// AppArmor's alternation, {a,b}, expanded (not nested: profiles attach by plain paths); the
// rest of its globbing is fnmatch's.
std::vector<std::string> expand_alternations(const std::string& pattern) {
    const size_t open = pattern.find('{');
    const size_t close = pattern.find('}', open);
    if (open == std::string::npos || close == std::string::npos) return {pattern};
    std::vector<std::string> expanded;
    const std::string choices = pattern.substr(open + 1, close - open - 1);
    size_t start = 0;
    for (;;) {
        const size_t comma = choices.find(',', start);
        const std::string choice = choices.substr(start, comma - start);
        for (std::string& rest : expand_alternations(pattern.substr(close + 1))) {
            expanded.push_back(pattern.substr(0, open) + choice + rest);
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return expanded;
}

}  // namespace

bool profile_attaches_to(const std::string& profile, const std::string& executable) {
    std::istringstream lines(profile);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream words(line);
        std::string word;
        words >> word;
        // "profile NAME ATTACHMENT ..." or "ATTACHMENT ... {"
        if (word == "profile" && !(words >> word && words >> word)) continue;
        if (word.empty() || word.front() != '/') continue;
        for (const std::string& pattern : expand_alternations(word)) {
            if (::fnmatch(pattern.c_str(), executable.c_str(), FNM_PATHNAME) == 0) return true;
        }
    }
    return false;
}

HostCheck diagnose_user_namespaces(const UserNamespaceFacts& facts) {
    HostCheck check{"user_namespaces", CheckStatus::kOk, "", "", ""};
    const bool restricted_by_apparmor = !facts.root && facts.apparmor_restrict == 1;
    const bool unconfined = facts.apparmor_label.empty() || facts.apparmor_label == "unconfined";
    if (facts.probe.ok) {
        check.found =
            "created one, mapped your ids, mounted in it and made the sandbox's other "
            "namespaces in it";
        if (restricted_by_apparmor && !unconfined) {
            check.found += " (allowed by the AppArmor profile '" + facts.apparmor_label + "')";
        }
        check.action = "builds each sandbox in its own user namespace";
        return check;
    }
    check.status = CheckStatus::kMissing;
    check.action = kNoSandbox;
    const std::string failure = " (" + facts.probe.message + ")";
    const int err = facts.probe.error;
    if (facts.max_user_namespaces == 0) {
        check.found = "user.max_user_namespaces is 0" + failure;
        check.fix =
            "sudo sysctl -w user.max_user_namespaces=15000 (and the same line in "
            "/etc/sysctl.d/ to keep it)";
    } else if (err == ENOSPC) {
        check.found =
            "the limit on nested or per-user user namespaces is reached "
            "(user.max_user_namespaces = " +
            (facts.max_user_namespaces ? std::to_string(*facts.max_user_namespaces)
                                       : std::string("?")) +
            ")" + failure;
        check.fix =
            "raise user.max_user_namespaces (sudo sysctl -w user.max_user_namespaces=15000) "
            "in the namespace that set it; a sandbox such as bwrap --disable-userns "
            "forbids nesting on purpose";
    } else if (!facts.root && facts.unprivileged_userns_clone == 0) {
        check.found = "kernel.unprivileged_userns_clone is 0" + failure;
        check.fix =
            "sudo sysctl -w kernel.unprivileged_userns_clone=1 (and the same line in "
            "/etc/sysctl.d/ to keep it)";
    } else if (restricted_by_apparmor && unconfined) {
        check.found =
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1) and no profile applies "
            "to " +
            (facts.executable.empty() ? std::string("sqbox") : facts.executable);
        const bool installed = facts.installed_profile.has_value();
        if (installed && profile_attaches_to(*facts.installed_profile, facts.executable) &&
            !profile_for_sqbox_loaded(facts)) {
            check.found += "; " + std::string(kInstalledProfile) + " names it but is not loaded";
            check.fix = "load it: sudo apparmor_parser -r " + std::string(kInstalledProfile);
        } else if (installed || profile_for_sqbox_loaded(facts)) {
            check.found += "; sqbox's profile is there for another path";
            check.fix = "run sqbox from the path " + std::string(kInstalledProfile) +
                        " names, or add " + facts.executable +
                        " to that profile and reload it: sudo apparmor_parser -r " +
                        kInstalledProfile;
        } else {
            check.fix = kAppArmorProfileFix;
        }
        check.found += failure;
    } else if (facts.seccomp_mode == 2 && (err == EPERM || err == EACCES)) {
        check.found =
            "sqbox runs under a seccomp filter (Seccomp: 2 in /proc/self/status, a "
            "container's profile) that denies it" +
            failure;
        check.fix = kSeccompFix;
    } else if (!unconfined && (err == EPERM || err == EACCES)) {
        check.found = "sqbox runs under the AppArmor profile '" + facts.apparmor_label +
                      "', which may deny it" + failure;
        check.fix =
            "run the container without that profile: in Kubernetes the container's "
            "securityContext.appArmorProfile.type: Unconfined; in Docker --security-opt "
            "apparmor=unconfined";
    } else {
        check.found = "the kernel refused" + failure;
        check.fix =
            "a kernel built with CONFIG_USER_NS=y, run outside a container or in one "
            "whose runtime allows user namespaces (see docs/doctor.md)";
    }
    return check;
}

HostCheck diagnose_fresh_proc(const ProbeResult& probe) {
    HostCheck check{"proc", CheckStatus::kOk, "a fresh /proc mounts in a new pid namespace",
                    "gives each sandbox a /proc of its own that shows only its processes", ""};
    if (probe.ok) return check;
    check.status = CheckStatus::kMissing;
    check.found = probe.message;
    check.action =
        "refuses to run, unless given --proc outer, which shows the sandbox this container's own "
        "/proc (less isolation: docs/pods.md)";
    if (probe.error == EPERM) {
        check.found +=
            " (the kernel mounts a fresh procfs only where one is already fully visible, "
            "and the /proc here is not: a container's masked paths are mounted over "
            "it)";
        check.fix =
            "in Kubernetes the container's securityContext.procMount: Unmasked with the "
            "pod's hostUsers: false; in Docker --security-opt systempaths=unconfined";
    } else {
        check.fix = "a kernel with procfs (CONFIG_PROC_FS) and pid namespaces (CONFIG_PID_NS)";
    }
    return check;
}

HostCheck diagnose_overlayfs(const ProbeResult& probe) {
    HostCheck check{"overlayfs", CheckStatus::kOk, "overlayfs mounts in a user namespace",
                    "stacks a throw-away writable layer on the image", ""};
    if (probe.ok) return check;
    check.status = CheckStatus::kDegraded;
    check.found = probe.message;
    check.action =
        "falls back to a read-only root (/tmp stays writable); an enroot container's writable "
        "layer is refused";
    check.fix = "a kernel (>= 5.11) with overlayfs: sudo modprobe overlay";
    return check;
}

std::vector<HostCheck> run_host_checks(const DoctorOptions& options) {
    std::vector<HostCheck> checks;
    checks.push_back(check_kernel(kernel_release()));
    const UserNamespaceFacts facts = gather_user_namespace_facts();
    checks.push_back(diagnose_user_namespaces(facts));
    checks.push_back(check_seccomp(probe_seccomp_filters(), facts.seccomp_mode));
    const ProbeResult fuse = probe_fuse_device();
    checks.push_back(check_fuse(fuse));
    if (facts.probe.ok) {
        checks.push_back(diagnose_overlayfs(probe_overlay_in_user_namespace()));
        checks.push_back(diagnose_fresh_proc(probe_fresh_proc()));
    } else {
        checks.push_back(skipped("overlayfs"));
        checks.push_back(skipped("proc"));
    }
    checks.push_back(check_cgroup(options));
    checks.push_back(check_landlock(landlock_abi_version()));
    if (options.image) checks.push_back(check_image(*options.image, fuse.ok));
    return checks;
}

bool run_will_work(const std::vector<HostCheck>& checks) {
    return std::none_of(checks.begin(), checks.end(), [](const HostCheck& check) {
        return check.status == CheckStatus::kMissing || check.status == CheckStatus::kSkipped;
    });
}

}  // namespace sqbox

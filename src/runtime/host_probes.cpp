#include "runtime/host_probes.h"

#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <csignal>
#include <cstring>
#include <exception>
#include <functional>

#include "runtime/mounts.h"
#include "runtime/supervisor.h"
#include "runtime/user_namespace.h"
#include "security/seccomp_filter.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/process.h"
#include "util/text.h"

namespace sqbox {
namespace {

// Runs `steps` in a child cloned with `namespaces` and returns how it went: the child sends "0"
// or "ERRNO MESSAGE" through a pipe. The child dies with this process and is reaped here.
ProbeResult probe_in_child(unsigned long namespaces, const char* purpose,
                           const std::function<void()>& steps) {
    Pipe pipe = make_pipe("a probe's report");
    ChildProcess child;
    try {
        child = ChildProcess(clone_process(namespaces, purpose));
    } catch (const Error& e) {
        // Not its message, whose hint guesses at the cause: the caller diagnoses it.
        const int err = e.system_errno();
        return {false, err, std::string("cannot create ") + purpose + ": " + std::strerror(err)};
    }
    if (child.pid() == 0) {
        pipe.read_end.reset();
        std::string report = "0";
        try {
            // Not die_with_parent: in a new pid namespace the parent's pid reads as 0.
            if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw system_error("prctl");
            steps();
        } catch (const Error& e) {
            report = std::to_string(e.system_errno()) + " " + e.what();
        } catch (const std::exception& e) {
            report = std::string("0 ") + e.what();
        }
        (void)write_all(pipe.write_end.get(), report.data(), report.size());  // read or lost
        ::_exit(0);
    }
    pipe.write_end.reset();
    std::string report;
    try {
        report = read_all(pipe.read_end.get(), "a probe's report");
    } catch (const Error& e) {
        return {false, e.system_errno(), e.what()};
    }
    child.kill_and_reap();
    if (report == "0") return {true, 0, ""};
    if (report.empty()) return {false, 0, std::string("the probe of ") + purpose + " died"};
    const size_t space = report.find(' ');
    int error = 0;
    (void)std::from_chars(report.data(), report.data() + space, error);  // 0 if malformed
    return {false, error, report.substr(space + 1)};
}

// The caller's ids, mapped to themselves; taken before the clone (inside, before the map is
// written, they read as the overflow ids).
IdMapping own_ids() {
    return {::getuid(), ::getgid(), ::getuid(), ::getgid()};
}

// The child's first steps in its new user namespace: its ids mapped, its mounts its own.
void enter_probe_namespaces(const IdMapping& ids) {
    write_own_id_maps(ids);
    make_mounts_private();
}

}  // namespace

std::optional<std::string> read_small_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return std::nullopt;
    try {
        return read_all(fd.get(), path);
    } catch (const Error&) {
        return std::nullopt;
    }
}

ProbeResult probe_user_namespace() {
    return probe_in_child(CLONE_NEWUSER | CLONE_NEWNS, "a user namespace", [ids = own_ids()] {
        enter_probe_namespaces(ids);
        (void)create_filesystem("tmpfs", {}, 0, "a tmpfs in a user namespace");
        // And the sandbox's other namespaces: a container's seccomp profile may deny those too.
        if (::unshare((kSandboxNamespaces & ~CLONE_NEWNS) | CLONE_NEWNET | CLONE_NEWCGROUP) != 0) {
            throw system_error(
                "cannot create the pid, ipc, uts, network and cgroup namespaces in it");
        }
    });
}

ProbeResult probe_overlay_in_user_namespace() {
    return probe_in_child(CLONE_NEWUSER | CLONE_NEWNS, "a user namespace", [ids = own_ids()] {
        enter_probe_namespaces(ids);
        // Its layers on a tmpfs over /proc, a directory every host has; this mount namespace and
        // everything in it go away with the child.
        UniqueFd tmpfs = create_filesystem("tmpfs", {}, 0, "a tmpfs for the overlay's layers");
        attach_mount_at(tmpfs.get(), "/proc", "the overlay's layers");
        for (const char* dir : {"/proc/lower", "/proc/upper", "/proc/work", "/proc/root"}) {
            if (::mkdir(dir, 0700) != 0) throw system_error(std::string("cannot create ") + dir);
        }
        UniqueFd overlay = create_filesystem("overlay",
                                             {{"lowerdir", "/proc/lower"},
                                              {"upperdir", "/proc/upper"},
                                              {"workdir", "/proc/work"},
                                              {"userxattr", ""}},
                                             MountAttr::kNoSuid | MountAttr::kNoDev, "overlayfs");
        attach_mount_at(overlay.get(), "/proc/root", "overlayfs");
    });
}

ProbeResult probe_fresh_proc() {
    return probe_in_child(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID,
                          "user, mount and pid namespaces", [ids = own_ids()] {
                              enter_probe_namespaces(ids);
                              UniqueFd proc = create_filesystem(
                                  "proc", {},
                                  MountAttr::kNoSuid | MountAttr::kNoDev | MountAttr::kNoExec,
                                  "/proc (proc)");
                              attach_mount_at(proc.get(), "/proc", "/proc");
                          });
}

ProbeResult probe_fuse_device() {
    struct stat info {};
    if (::stat("/dev/fuse", &info) != 0) {
        return {false, errno, system_error("/dev/fuse").what()};
    }
    if (!S_ISCHR(info.st_mode)) return {false, 0, "/dev/fuse is not a character device"};
    UniqueFd fuse(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
    if (!fuse) return {false, errno, system_error("cannot open /dev/fuse").what()};
    return {true, 0, ""};
}

ProbeResult probe_seccomp_filters() {
    if (::prctl(PR_GET_SECCOMP) < 0) {
        return {false, errno, system_error("prctl(PR_GET_SECCOMP)").what()};
    }
    // The action the sandbox's filters use most: asking for it needs filter support (>= 4.14).
    uint32_t action = SECCOMP_RET_ERRNO;
    if (::syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) != 0) {
        return {false, errno, system_error("seccomp(SECCOMP_GET_ACTION_AVAIL)").what()};
    }
    return {true, 0, ""};
}

std::optional<long> parse_sysctl_value(std::string_view text) {
    text = trim_space(text);
    long value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
        return std::nullopt;
    }
    return value;
}

std::optional<long> read_sysctl(const std::string& name) {
    std::optional<std::string> text = read_small_file("/proc/sys/" + name);
    if (!text) return std::nullopt;
    return parse_sysctl_value(*text);
}

std::optional<int> parse_seccomp_mode(std::string_view proc_status) {
    constexpr std::string_view kField = "Seccomp:";
    size_t start = 0;
    while (start < proc_status.size()) {
        const size_t end = std::min(proc_status.find('\n', start), proc_status.size());
        std::string_view line = proc_status.substr(start, end - start);
        if (line.starts_with(kField)) {
            std::optional<long> mode = parse_sysctl_value(line.substr(kField.size()));
            if (!mode || *mode < 0 || *mode > 2) return std::nullopt;
            return static_cast<int>(*mode);
        }
        start = end + 1;
    }
    return std::nullopt;
}

std::optional<int> own_seccomp_mode() {
    std::optional<std::string> status = read_small_file("/proc/self/status");
    if (!status) return std::nullopt;
    return parse_seccomp_mode(*status);
}

std::vector<AppArmorProfile> parse_apparmor_profiles(std::string_view text) {
    std::vector<AppArmorProfile> profiles;
    size_t start = 0;
    while (start < text.size()) {
        const size_t end = std::min(text.find('\n', start), text.size());
        std::string_view line = trim_space(text.substr(start, end - start));
        start = end + 1;
        if (line.empty()) continue;
        AppArmorProfile profile;
        // The mode is the last parenthesised word; a name may itself contain spaces.
        const size_t open = line.rfind(" (");
        if (open != std::string_view::npos && line.back() == ')') {
            profile.name = std::string(line.substr(0, open));
            profile.mode = std::string(line.substr(open + 2, line.size() - open - 3));
        } else {
            profile.name = std::string(line);
        }
        profiles.push_back(std::move(profile));
    }
    return profiles;
}

std::vector<AppArmorProfile> loaded_apparmor_profiles() {
    std::optional<std::string> text = read_small_file("/sys/kernel/security/apparmor/profiles");
    return text ? parse_apparmor_profiles(*text) : std::vector<AppArmorProfile>{};
}

std::string parse_apparmor_label(std::string_view label) {
    // The label may end in a NUL the kernel counts in the file's size.
    while (!label.empty() && label.back() == '\0') label.remove_suffix(1);
    label = trim_space(label);
    const size_t mode = label.rfind(" (");
    if (mode != std::string_view::npos && label.back() == ')') label = label.substr(0, mode);
    return std::string(label);
}

std::string own_apparmor_label() {
    // The stacking-aware file first (Linux >= 5.8), then the one every version has, whose text
    // belongs to whichever LSM is the "display" one.
    if (::access("/sys/kernel/security/apparmor", F_OK) != 0) return "";
    for (const char* path : {"/proc/self/attr/apparmor/current", "/proc/self/attr/current"}) {
        std::optional<std::string> text = read_small_file(path);
        if (text && !trim_space(*text).empty()) return parse_apparmor_label(*text);
    }
    return "";
}

bool is_initial_uid_map(std::string_view uid_map) {
    // "0 0 4294967295", however the columns are padded.
    std::vector<std::string_view> fields;
    uid_map = trim_space(uid_map);
    while (!uid_map.empty()) {
        const size_t end = std::min(uid_map.find_first_of(" \t\n"), uid_map.size());
        fields.push_back(uid_map.substr(0, end));
        uid_map = trim_space(uid_map.substr(end));
    }
    return fields.size() == 3 && fields[0] == "0" && fields[1] == "0" && fields[2] == "4294967295";
}

bool host_root() {
    if (::geteuid() != 0) return false;
    std::optional<std::string> uid_map = read_small_file("/proc/self/uid_map");
    return uid_map && is_initial_uid_map(*uid_map);
}

KernelRelease kernel_release() {
    KernelRelease kernel;
    const SeccompTarget target = sandbox_seccomp_target();
    kernel.major = target.kernel_major;
    kernel.minor = target.kernel_minor;
    utsname name{};
    if (::uname(&name) == 0) kernel.release = name.release;
    return kernel;
}

}  // namespace sqbox

// Probes of the host for `sqbox doctor`: each tries, in a throw-away child where it needs
// namespaces, what a launch does (runtime/pipeline.cpp), and reads the settings that explain a
// refusal. The readers of those settings are pure functions of the text, for the unit tests.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sqbox {

// A probe's outcome: ok, or the failing step's message and errno.
struct ProbeResult {
    bool ok = false;
    int error = 0;        // errno of the failing step (0 when not a system call)
    std::string message;  // "cannot ...: <strerror>", empty when ok
};

// Clones a child into a new user + mount namespace (as the launcher clones the supervisor), maps
// the caller's ids, creates a tmpfs in it and then the sandbox's other namespaces: a namespace
// that is created but grants no capabilities (Ubuntu's AppArmor restriction) fails at the tmpfs.
ProbeResult probe_user_namespace();

// Same, then mounts an overlay (tmpfs below and above) as the sandbox's root is mounted.
ProbeResult probe_overlay_in_user_namespace();

// Clones a child into new user, mount and pid namespaces (as init is) and mounts a fresh procfs:
// EPERM when the procfs this process sees has entries mounted over (a container's masked paths).
ProbeResult probe_fresh_proc();

// Opens /dev/fuse for reading and writing, as the supervisor does.
ProbeResult probe_fuse_device();

// Whether seccomp filters can be installed here (SECCOMP_GET_ACTION_AVAIL).
ProbeResult probe_seccomp_filters();

// The text of a small file of /proc, /sys or /etc; nullopt when it cannot be read.
std::optional<std::string> read_small_file(const std::string& path);

// A sysctl file's value ("1\n" -> 1); nullopt when the text is not a number.
std::optional<long> parse_sysctl_value(std::string_view text);
// The value of /proc/sys/`name` ("user/max_user_namespaces"); nullopt when absent or unreadable.
std::optional<long> read_sysctl(const std::string& name);

// "Seccomp:" of /proc/self/status: 0 none, 1 strict, 2 filters; nullopt when not there.
std::optional<int> parse_seccomp_mode(std::string_view proc_status);
std::optional<int> own_seccomp_mode();

struct AppArmorProfile {
    std::string name;  // a profile name or the path it attaches to
    std::string mode;  // "enforce", "complain", "unconfined", ...
};
// /sys/kernel/security/apparmor/profiles: one "NAME (MODE)" per line.
std::vector<AppArmorProfile> parse_apparmor_profiles(std::string_view text);
// The loaded profiles; empty when AppArmor is absent or the list is not readable (it is root's).
std::vector<AppArmorProfile> loaded_apparmor_profiles();
// The profile name of a confinement label: "sqbox (unconfined)" -> "sqbox", "unconfined" ->
// "unconfined".
std::string parse_apparmor_label(std::string_view label);
// This process's AppArmor profile ("unconfined" when none applies); "" without AppArmor.
std::string own_apparmor_label();

// Whether `uid_map` (the text of /proc/self/uid_map) is the initial user namespace's: all ids
// mapped to themselves. Root there is exempt from the restrictions on unprivileged user
// namespaces; root of a container's user namespace is not.
bool is_initial_uid_map(std::string_view uid_map);
// The caller is root of the initial user namespace.
bool host_root();

// The running kernel's release ("6.1.0-18-amd64") and its major and minor numbers.
struct KernelRelease {
    std::string release;
    unsigned major = 0;
    unsigned minor = 0;
};
KernelRelease kernel_release();

}  // namespace sqbox

// `sqbox doctor`: every prerequisite of a launch checked on this host (runtime/host_probes.h),
// each with what sqbox does about it and the fix. The diagnoses are pure functions of what the
// probes found, for the unit tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/host_probes.h"

namespace sqbox {

enum class CheckStatus {
    kOk,        // works as sqbox wants
    kDegraded,  // sqbox runs with a fallback (said in `action`)
    kMissing,   // `sqbox run` fails (or refuses the image)
    kSkipped,   // not tried: a check it needs is missing (said in `found`)
};

// "ok", "degraded", "missing", "skipped".
const char* check_status_name(CheckStatus status);

struct HostCheck {
    std::string name;  // "user_namespaces", "fuse", ...: stable, for tools
    CheckStatus status = CheckStatus::kOk;
    std::string found;   // what the probe saw
    std::string action;  // what sqbox does about it
    std::string fix;     // the exact change that makes it ok; empty when ok
};

struct DoctorOptions {
    std::optional<std::string> image;  // IMAGE, as given
    std::string cgroup_parent;         // --cgroup DIR, as for run
};

// All checks, in the order a launch meets them; the image last.
std::vector<HostCheck> run_host_checks(const DoctorOptions& options);

// Whether `sqbox run` works with these results (degraded is fine).
bool run_will_work(const std::vector<HostCheck>& checks);

// What explains a user namespace refused (or granted) here.
struct UserNamespaceFacts {
    ProbeResult probe;
    std::optional<long> max_user_namespaces;         // user.max_user_namespaces
    std::optional<long> unprivileged_userns_clone;   // kernel.unprivileged_userns_clone (Debian)
    std::optional<long> apparmor_restrict;           // kernel.apparmor_restrict_unprivileged_userns
    std::string apparmor_label;                      // this process's profile; "" without AppArmor
    std::vector<AppArmorProfile> apparmor_profiles;  // readable by root only
    std::optional<std::string> installed_profile;    // the text of /etc/apparmor.d/sqbox
    std::optional<int> seccomp_mode;  // of this process: 2 under a container's filter
    bool root = false;       // root of the initial user namespace: the sysctls above do not bind it
    std::string executable;  // this binary's path, which an AppArmor profile names
};
UserNamespaceFacts gather_user_namespace_facts();
HostCheck diagnose_user_namespaces(const UserNamespaceFacts& facts);

// Whether an AppArmor profile's text attaches to `executable` (its attachment paths, with
// AppArmor's {a,b} alternations and * globs).
bool profile_attaches_to(const std::string& profile, const std::string& executable);

// The fresh /proc and overlayfs checks from their probes' results.
HostCheck diagnose_fresh_proc(const ProbeResult& probe);
HostCheck diagnose_overlayfs(const ProbeResult& probe);

}  // namespace sqbox

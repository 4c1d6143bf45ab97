// Identity inside the sandbox's user namespace.
#pragma once

#include <string>

#include <sys/types.h>

namespace sqbox {

struct IdMapping {
    uid_t inside_uid;
    gid_t inside_gid;
    uid_t outside_uid;
    gid_t outside_gid;
};

// Maps the single outside uid/gid to the inside ones for the calling process, which must have just
// entered a new user namespace. Unprivileged callers may map only themselves, so this is the whole
// map; setgroups is denied first, as the kernel requires for an unprivileged gid_map.
// `proc` is where a procfs that shows the caller is mounted ("/proc", or "/oldroot/proc" from a
// scratch root).
void write_own_id_maps(const IdMapping& mapping, const std::string& proc = "/proc");

// clone_process (util/process.h) with CLONE_NEWUSER among `namespace_flags`. A refusal's Error
// names why and the fix, as `sqbox doctor` finds them (runtime/host_checks.h): a sysctl,
// AppArmor's restriction, a container's seccomp profile.
pid_t clone_into_user_namespace(unsigned long namespace_flags, const char* purpose);

// Whether this process may create a user namespace: a child is cloned into one and exits at
// once. Throws clone_into_user_namespace's Error if not.
void require_user_namespaces();

}  // namespace sqbox

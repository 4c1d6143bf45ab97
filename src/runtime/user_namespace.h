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

}  // namespace sqbox

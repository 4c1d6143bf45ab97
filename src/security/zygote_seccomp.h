// The seccomp filters of `sqbox serve --zygote` (docs/serve.md, "The zygote"). The zygote is the
// image's python3 with the --preload modules imported; for each request it forks a child that
// makes a sandbox of its own (new user, mount, pid, network, ipc, uts and cgroup namespaces, a
// fresh writable layer) and then installs the server's own filter on top before any of the
// request's code runs. So the zygote's filter is the server's profile plus the few calls that
// making takes, and the filter each request runs under is the server's profile unchanged.
#pragma once

#include <sched.h>
#include <signal.h>

#include <string>

#include "security/seccomp_filter.h"

namespace sqbox {

// The namespaces of each request's sandbox, made by one clone(2) (a fork into them).
inline constexpr unsigned long kZygoteNamespaces = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID |
                                                   CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |
                                                   CLONE_NEWCGROUP;
// The one clone(2) first argument with namespace flags the zygote's filter lets through.
inline constexpr unsigned long kZygoteCloneFlags = kZygoteNamespaces | SIGCHLD;

// The zygote's filter: the profile `choice` names (as --seccomp takes it), with clone allowed for
// kZygoteCloneFlags exactly (besides the profile's own clone rules that allow), and mount,
// umount2 and pivot_root allowed (each takes capabilities the zygote has only over the namespaces
// it made). Throws Error for "none", and for
// a profile whose filter would let a request make namespaces of its own (what the requests' filter
// is relied on to refuse).
SeccompFilter compile_zygote_seccomp_filter(const std::string& choice);

// Throws Error for a --seccomp choice the zygote cannot have at all ("none").
void check_zygote_seccomp_choice(const std::string& choice);

// Throws Error unless `request_filter` refuses unshare and clone with CLONE_NEWUSER and mount.
void check_refuses_namespaces(const SeccompFilter& request_filter, const std::string& choice);

}  // namespace sqbox

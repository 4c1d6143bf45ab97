#include "runtime/user_namespace.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "runtime/host_checks.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/process.h"

namespace sqbox {

void write_own_id_maps(const IdMapping& mapping, const std::string& proc) {
    write_file_at(AT_FDCWD, proc + "/self/setgroups", "deny");
    write_file_at(
        AT_FDCWD, proc + "/self/uid_map",
        std::to_string(mapping.inside_uid) + " " + std::to_string(mapping.outside_uid) + " 1\n");
    write_file_at(
        AT_FDCWD, proc + "/self/gid_map",
        std::to_string(mapping.inside_gid) + " " + std::to_string(mapping.outside_gid) + " 1\n");
}

pid_t clone_into_user_namespace(unsigned long namespace_flags, const char* purpose) {
    try {
        return clone_process(namespace_flags | CLONE_NEWUSER, purpose);
    } catch (const Error& e) {
        const int err = e.system_errno();
        if (err != EPERM && err != ENOSPC && err != EACCES) throw;
        const HostCheck diagnosis = diagnose_user_namespaces(gather_user_namespace_facts());
        if (diagnosis.status == CheckStatus::kOk) {
            throw Error(std::string(e.what()) + " (sqbox doctor explains)", err);
        }
        throw Error(std::string("cannot create ") + purpose + ": " + diagnosis.found +
                        "; fix: " + diagnosis.fix + " (sqbox doctor explains)",
                    err);
    }
}

void require_user_namespaces() {
    const pid_t pid = clone_into_user_namespace(CLONE_NEWUSER, "the sandbox's user namespace");
    if (pid == 0) ::_exit(0);
    ChildProcess child(pid);
    child.kill_and_reap();
}

}  // namespace sqbox

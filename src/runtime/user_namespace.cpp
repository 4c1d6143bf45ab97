#include "runtime/user_namespace.h"

#include <fcntl.h>

#include <string>

#include "util/errors.h"
#include "util/files.h"

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

}  // namespace sqbox

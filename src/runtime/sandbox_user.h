// The account the payload runs as: an entry for the sandbox's uid and gid in the sandbox's own
// /etc/passwd and /etc/group (the image's files with it merged in, written into the sandbox's
// writable layer, never into the image), and USER, LOGNAME and HOME. Programs that look their user
// up (getpwuid, getpass.getuser, Path.home, git, ssh) then find one, as under enroot, whose
// shadow hook adds the caller to the container's files.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "sqbox/config.h"

namespace sqbox {

// The name used when the caller's own is missing or not a portable account name.
inline constexpr const char* kFallbackUserName = "sandbox";
// The sandbox user's home unless it is root: the sandbox's /tmp, which exists and is writable
// however the root is shown (throwaway, read-only, an enroot container's layer).
inline constexpr const char* kSandboxUserHome = "/tmp";
// The kernel's overflow uid and gid: what files of unmapped owners show as (e.g. in /proc).
inline constexpr uid_t kOverflowId = 65534;

struct SandboxUser {
    uid_t uid = 0;
    gid_t gid = 0;
    std::string name;   // login name: USER, LOGNAME
    std::string group;  // the primary group's name
    std::string home;   // HOME
    std::string shell;
};

// Front ends, once config.map_root is set: the caller's effective ids and, from the host's
// account database, their login and primary group names where the sandbox shows them (empty
// where the host has none, and for ids that are root inside).
void set_caller_identity(SandboxConfig& config);

// A name that is safe in a passwd or group line and unambiguous: 1 to 32 of [A-Za-z0-9._-], not
// starting with '-', not all digits, not "." or "..".
bool is_portable_account_name(std::string_view name);

// Who the payload is in the sandbox described by `config`: root (uid 0, home /root) with
// map_root or when the caller is root, else the caller's ids under the caller's names (those that
// are portable; else kFallbackUserName, and the user's name for the group), home kSandboxUserHome.
SandboxUser sandbox_user(const SandboxConfig& config);

// The image's /etc/passwd (or /etc/group) text with `user`'s entry merged in: the entry first
// (the C library returns the first match), the image's entry of the same name dropped; for uid
// (gid) 0 the image's own entry is kept when it has one. Entries for root and nobody (nogroup) are
// added when the image has none, and `_apt`'s is dropped (apt would try to switch to it), as
// enroot does. The image's other lines are kept as they are.
std::string merged_passwd(std::string_view image_passwd, const SandboxUser& user);
std::string merged_group(std::string_view image_group, const SandboxUser& user);

struct AccountFiles {
    std::string passwd;
    std::string group;
};

// Init: the image's /etc/passwd and /etc/group below `root_fd`, resolved inside that root (a
// symlink cannot lead out of it; a missing file counts as empty) and read only if regular files
// of at most kMaxAccountFileBytes, merged with the sandbox user of `config`. Throws Error (naming
// the file) when one is too large or not a regular file.
inline constexpr size_t kMaxAccountFileBytes = size_t{256} * 1024;
AccountFiles sandbox_account_files(int root_fd, const SandboxConfig& config);

}  // namespace sqbox

#include "security/landlock.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// Debian 12's kernel headers predate most of these; the values are fixed kernel ABI.
constexpr uint64_t kFsWriteFile = 1ULL << 1;
constexpr uint64_t kFsReadFile = 1ULL << 2;
constexpr uint64_t kFsReadDir = 1ULL << 3;
constexpr uint64_t kFsRemoveDir = 1ULL << 4;
constexpr uint64_t kFsRemoveFile = 1ULL << 5;
constexpr uint64_t kFsMakeDir = 1ULL << 7;
constexpr uint64_t kFsMakeReg = 1ULL << 8;
constexpr uint64_t kFsMakeChar = 1ULL << 6;
constexpr uint64_t kFsMakeBlock = 1ULL << 11;
constexpr uint64_t kFsMakeSym = 1ULL << 12;
constexpr uint64_t kFsRefer = 1ULL << 13;                 // ABI 2
constexpr uint64_t kFsTruncate = 1ULL << 14;              // ABI 3
constexpr uint64_t kFsIoctlDev = 1ULL << 15;              // ABI 5
constexpr uint64_t kNetBindTcp = 1ULL << 0;               // ABI 4
constexpr uint64_t kNetConnectTcp = 1ULL << 1;            // ABI 4
constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0;  // ABI 6
constexpr uint64_t kScopeSignal = 1ULL << 1;              // ABI 6
constexpr uint32_t kCreateRulesetVersion = 1U << 0;
constexpr int kRulePathBeneath = 1;

// The kernel's struct landlock_ruleset_attr at its newest size; unused fields stay zero, which
// older kernels accept.
struct RulesetAttr {
    uint64_t handled_access_fs = 0;
    uint64_t handled_access_net = 0;
    uint64_t scoped = 0;
};

struct __attribute__((packed)) PathBeneathAttr {
    uint64_t allowed_access = 0;
    int32_t parent_fd = -1;
};

uint64_t handled_fs_rights(int abi) {
    uint64_t rights = (kFsMakeSym << 1) - 1;  // ABI 1: bits 0 (execute) to 12 (make symlink)
    if (abi >= 2) rights |= kFsRefer;
    if (abi >= 3) rights |= kFsTruncate;
    if (abi >= 5) rights |= kFsIoctlDev;
    return rights;
}

}  // namespace

int landlock_abi_version() {
    long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
    return abi > 0 ? static_cast<int>(abi) : 0;
}

namespace {

// Restricts the calling process to `allowed` rights beneath `directory_fd` (none anywhere when it
// is -1), nothing elsewhere;
// from ABI 6 on, no signals or abstract-socket connections outside the domain either, and with
// `no_tcp` (ABI 4 on) no TCP bind or connect at all.
// Without the scope the payload could still signal init; init ignores it, but nothing outside
// the payload's own processes should be reachable at all.
uint64_t scoped_rights(int abi) {
    return abi >= 6 ? kScopeAbstractUnixSocket | kScopeSignal : 0;
}

size_t ruleset_attr_size(int abi) {
    if (abi >= 6) return sizeof(RulesetAttr);
    if (abi >= 4) return offsetof(RulesetAttr, scoped);
    return sizeof(uint64_t);
}

void restrict_self(int abi, int directory_fd, uint64_t allowed, bool no_tcp, const char* what) {
    RulesetAttr ruleset;
    ruleset.handled_access_fs = handled_fs_rights(abi);
    if (no_tcp && abi >= 4) ruleset.handled_access_net = kNetBindTcp | kNetConnectTcp;
    ruleset.scoped = scoped_rights(abi);
    const size_t size = ruleset_attr_size(abi);
    UniqueFd ruleset_fd(
        static_cast<int>(::syscall(SYS_landlock_create_ruleset, &ruleset, size, 0U)));
    if (!ruleset_fd) {
        throw system_error(std::string("cannot create the landlock ruleset for ") + what);
    }
    if (directory_fd >= 0) {
        PathBeneathAttr beneath;
        beneath.allowed_access = ruleset.handled_access_fs & allowed;
        beneath.parent_fd = directory_fd;
        if (::syscall(SYS_landlock_add_rule, ruleset_fd.get(), kRulePathBeneath, &beneath, 0U) !=
            0) {
            throw system_error(std::string("cannot add the landlock rule for ") + what);
        }
    }
    if (::syscall(SYS_landlock_restrict_self, ruleset_fd.get(), 0U) != 0) {
        throw system_error(std::string("cannot apply landlock to ") + what);
    }
}

}  // namespace

// Everything beneath the root but device nodes.
constexpr uint64_t kPayloadRights = ~(kFsMakeChar | kFsMakeBlock);

void apply_landlock(int abi) {
    UniqueFd root(::open("/", O_PATH | O_CLOEXEC | O_DIRECTORY));
    if (!root) throw system_error("cannot open / for landlock");
    restrict_self(abi, root.get(), kPayloadRights, false, "the payload");
}

LandlockRuleset payload_landlock_ruleset(int abi) {
    LandlockRuleset ruleset;
    ruleset.handled_fs = handled_fs_rights(abi);
    ruleset.scoped = scoped_rights(abi);
    ruleset.attr_size = ruleset_attr_size(abi);
    ruleset.allowed_beneath_root = ruleset.handled_fs & kPayloadRights;
    return ruleset;
}

void confine_to_directory(int abi, int directory_fd, bool symlinks) {
    // Directories and regular files only (and symlinks if asked): no devices, FIFOs, sockets, no
    // execution.
    const uint64_t allowed = kFsWriteFile | kFsReadFile | kFsReadDir | kFsRemoveDir |
                             kFsRemoveFile | kFsMakeDir | kFsMakeReg | kFsTruncate |
                             (symlinks ? kFsMakeSym : 0);
    restrict_self(abi, directory_fd, allowed, true, "the unpacking process");
}

void forbid_files_and_tcp(int abi) {
    restrict_self(abi, -1, 0, true, "the layer reader");
}

}  // namespace sqbox

// Landlock: the kernel's unprivileged file-access control. sqbox uses it as a second wall behind
// the mount namespace: the payload may only reach files beneath the sandbox's own root, so even a
// descriptor to a host directory (leaked by a bug, as in runc's CVE-2024-21626) opens nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sqbox {

// The kernel's Landlock ABI version, or 0 when Landlock is absent or disabled.
int landlock_abi_version();

// Confines the calling process (and everything it starts) to the tree beneath "/" using the
// rights of ABI `abi` (>= 1): everything there except creating device nodes. From ABI 6 on it also
// stops signals and abstract-socket connections to processes outside the domain (sqbox's init).
// no_new_privs must be set. Throws on failure.
void apply_landlock(int abi);

// Confines the calling process (and everything it starts) to directories and regular files
// beneath `directory_fd` (reading, writing, creating, removing; nothing executed), and nothing
// anywhere else; from ABI 4 on no TCP bind or connect, from ABI 6 on no signals or abstract-socket
// connections outside the domain. Descriptors already open stay usable. For sqbox's own work on
// untrusted input. With `symlinks`, it may also create symbolic links there
// (image/image_unpack.h: an unpacked image keeps its symlinks, never followed while it is made).
// no_new_privs must be set. Throws on failure.
void confine_to_directory(int abi, int directory_fd, bool symlinks = false);

// Confines the calling process (and everything it starts) to the descriptors it holds: no file or
// directory may be opened, created, renamed or removed anywhere; from ABI 4 on no TCP bind or
// connect, from ABI 6 on no signals or abstract-socket connections outside the domain.
// Descriptors already open stay usable with the rights they were opened with. For sqbox's
// parsers of untrusted data whose inputs and output are opened for them (import's layer reader).
// no_new_privs must be set. Throws on failure.
void forbid_files_and_tcp(int abi);

// What apply_landlock(abi) asks of the kernel, as numbers: for a confinement made by code that is
// not sqbox's (serve's zygote, src/session/zygote.py, applies it in each request's sandbox).
struct LandlockRuleset {
    uint64_t handled_fs = 0;            // landlock_ruleset_attr.handled_access_fs
    uint64_t scoped = 0;                // landlock_ruleset_attr.scoped (ABI 6 on)
    size_t attr_size = 0;               // the size of landlock_ruleset_attr this ABI reads
    uint64_t allowed_beneath_root = 0;  // the one rule's rights, beneath "/"
};
LandlockRuleset payload_landlock_ruleset(int abi);

}  // namespace sqbox

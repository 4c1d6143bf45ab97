// Giving up every privilege before the payload runs.
#pragma once

namespace sqbox {

// Locks the securebits (so neither uid 0 nor a setuid/file-capability binary regains
// capabilities), empties the bounding and ambient sets, clears the effective, permitted and
// inheritable sets, and sets no_new_privs. Irreversible for the calling process.
void drop_all_privileges();

}  // namespace sqbox

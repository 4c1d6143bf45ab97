// The user's image server key: a secret of 32 random bytes in the user's private cache directory
// that a launcher and the user's shared image server each prove they hold before either trusts
// the other. The kernel tells a socket's peer's uid and pid, not which container it is in: another
// container of the same uid that shares the network namespace passes those checks, and it cannot
// read the caller's files. SECURITY.md, "The shared image server", argues it.
#pragma once

#include <sys/types.h>

#include <array>
#include <string>
#include <string_view>

#include "util/random_bytes.h"

namespace sqbox {

constexpr size_t kServerKeyBytes = 32;
using ServerKey = std::array<unsigned char, kServerKeyBytes>;

// Random bytes from the kernel, for a key or a challenge.
inline ServerKey random_key_bytes() {
    return random_bytes<kServerKeyBytes>();
}

// The bytes of a key, challenge or proof as the text of a message (or a proof's input).
inline std::string key_text(const ServerKey& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// The key in `cache_directory` (sqbox_cache_directory()), made there first if it has none:
// the directory must be the caller's and written by no one else, the key file the caller's,
// 0600, of exactly kServerKeyBytes. Throws Error saying why not.
ServerKey user_server_key(const std::string& cache_directory);

// The key as the exec'd server receives it: exactly kServerKeyBytes on `fd`, then EOF.
ServerKey read_server_key(int fd);

// A public tag of the key, part of the server's name: launchers of one key meet their server,
// launchers of another (another cache directory) start their own.
std::string server_key_tag(const ServerKey& key);

// Who proves: the answer of each end differs, so neither can pass the other's off as its own.
enum class ProofRole { kLauncher, kServer };

// The proof that the sender holds `key`, for a server of `identity` and the launcher of pid
// `launcher` (the one that connected to the server, as both ends' common pid namespace numbers
// it): an HMAC-SHA256 of the role, the identity, the launcher's pid and both ends' challenges
// (`challenge` is the peer's, `own` the sender's). The pid binds both proofs to the one
// connection between that launcher and the server: a process between them, passing each one's
// messages to the other, connects to the server as itself, and neither end takes the proofs.
ServerKey key_proof(const ServerKey& key, ProofRole role, std::string_view identity, pid_t launcher,
                    std::string_view challenge, std::string_view own);

// `proof` is key_proof's answer for these, compared in constant time.
bool is_key_proof(std::string_view proof, const ServerKey& key, ProofRole role,
                  std::string_view identity, pid_t launcher, std::string_view challenge,
                  std::string_view own);

}  // namespace sqbox

#include "runtime/server_key.h"

#include <fcntl.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

#include "util/errors.h"
#include "util/files.h"
#include "util/text.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr const char* kKeyFileName = "image-server.key";

// The key of the file open on `fd` (`path` for messages), which must be the caller's alone.
ServerKey key_of_file(int fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw system_error("cannot stat " + path);
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 ||
        st.st_size != static_cast<off_t>(kServerKeyBytes)) {
        throw Error(path + " must be a file of yours of " + std::to_string(kServerKeyBytes) +
                    " bytes that no one else can read or write");
    }
    return read_server_key(fd);
}

// Writes a new key beside `path` and links it there, unless another run did first (then its key
// stands: the link of a complete file is the only way a key appears under the name).
void make_key_file(const std::string& directory, const std::string& path) {
    std::string temporary = directory + "/." + kKeyFileName + ".XXXXXX";
    UniqueFd made(::mkostemp(temporary.data(), O_CLOEXEC));  // 0600
    if (!made) throw system_error("cannot create " + temporary);
    struct RemoveTemporary {
        const std::string& path;
        ~RemoveTemporary() { (void)::unlink(path.c_str()); }  // linked or not, it goes
    } remove{temporary};
    const ServerKey key = random_key_bytes();
    if (!write_all(made.get(), key.data(), key.size())) {
        throw system_error("cannot write " + temporary);
    }
    if (::link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST) {
        throw system_error("cannot create " + path);
    }
}

}  // namespace

ServerKey user_server_key(const std::string& cache_directory) {
    if (cache_directory.empty()) {
        throw Error("no cache directory for the image server's key: set SQBOX_CACHE_DIR or HOME");
    }
    // A cache directory that is a symlink (to a larger file system, say) is checked, and used, as
    // the directory it leads to: whoever could change the link could change a directory on the
    // way to it as well.
    const std::unique_ptr<char, decltype(&std::free)> resolved(
        ::realpath(cache_directory.c_str(), nullptr), &std::free);
    const std::string directory = resolved ? std::string(resolved.get()) : cache_directory;
    const std::string path = directory + "/" + kKeyFileName;
    UniqueFd file(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file && errno == ENOENT) {
        make_private_directory(directory);
        make_key_file(directory, path);
        file = UniqueFd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    } else {
        require_private_directory(directory);  // else others could have put it there
    }
    if (!file) throw system_error("cannot open " + path);
    return key_of_file(file.get(), path);
}

ServerKey read_server_key(int fd) {
    ServerKey key{};
    unsigned char extra = 0;
    if (read_full(fd, key.data(), key.size()) != static_cast<ssize_t>(key.size()) ||
        read_full(fd, &extra, 1) != 0) {
        throw Error("the image server's key is not " + std::to_string(kServerKeyBytes) + " bytes");
    }
    return key;
}

std::string server_key_tag(const ServerKey& key) {
    const ServerKey tag = key_proof(key, ProofRole::kServer, "the server's name", 0, {}, {});
    return hex_of(std::span(tag).first(8));
}

ServerKey key_proof(const ServerKey& key, ProofRole role, std::string_view identity, pid_t launcher,
                    std::string_view challenge, std::string_view own) {
    hmac_sha256_ctx context{};
    hmac_sha256_set_key(&context, key.size(), key.data());
    const auto add = [&context](std::string_view part) {
        // Each part after its length: no two different lists of parts hash alike.
        const std::string length = std::to_string(part.size()) + ":";
        hmac_sha256_update(&context, length.size(),
                           reinterpret_cast<const uint8_t*>(length.data()));
        hmac_sha256_update(&context, part.size(), reinterpret_cast<const uint8_t*>(part.data()));
    };
    add(role == ProofRole::kLauncher ? "sqbox launcher" : "sqbox image server");
    add(identity);
    add(std::to_string(launcher));
    add(challenge);
    add(own);
    ServerKey proof{};
    hmac_sha256_digest(&context, proof.size(), proof.data());
    return proof;
}

bool is_key_proof(std::string_view proof, const ServerKey& key, ProofRole role,
                  std::string_view identity, pid_t launcher, std::string_view challenge,
                  std::string_view own) {
    const ServerKey expected = key_proof(key, role, identity, launcher, challenge, own);
    return proof.size() == expected.size() &&
           memeql_sec(proof.data(), expected.data(), expected.size()) != 0;
}

}  // namespace sqbox

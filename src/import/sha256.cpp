#include "import/sha256.h"

#include <nettle/sha2.h>

#include <array>
#include <cerrno>
#include <vector>

#include "util/errors.h"
#include "util/files.h"
#include "util/text.h"

namespace sqbox {

struct Sha256::State {
    sha256_ctx context{};
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
    sha256_init(&state_->context);
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t size) {
    sha256_update(&state_->context, size, static_cast<const uint8_t*>(data));
}

std::string Sha256::digest() {
    std::array<uint8_t, SHA256_DIGEST_SIZE> bytes{};
    sha256_digest(&state_->context, bytes.size(), bytes.data());
    return "sha256:" + hex_of(bytes);
}

std::string sha256_of_fd(int fd, const std::string& what) {
    Sha256 hash;
    std::vector<char> buffer(size_t{1} << 20);
    for (;;) {
        ssize_t count = read_full(fd, buffer.data(), buffer.size());
        if (count < 0) throw system_error("cannot read " + what);
        if (count == 0) break;
        hash.update(buffer.data(), static_cast<size_t>(count));
        if (static_cast<size_t>(count) < buffer.size()) break;
    }
    return hash.digest();
}

std::string sha256_of(std::string_view data) {
    Sha256 hash;
    hash.update(data);
    return hash.digest();
}

void check_digest(const std::string& expected, const std::string& actual, const std::string& what) {
    if (expected != actual) {
        throw Error(what + ": digest mismatch (expected " + expected + ", got " + actual + ")");
    }
}

bool is_sha256_digest(const std::string& digest) {
    constexpr std::string_view kPrefix = "sha256:";
    if (digest.size() != kPrefix.size() + 64 || digest.compare(0, kPrefix.size(), kPrefix) != 0) {
        return false;
    }
    for (size_t i = kPrefix.size(); i < digest.size(); ++i) {
        const char c = digest[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

}  // namespace sqbox

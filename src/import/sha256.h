// Streaming SHA-256 for verifying blobs by digest, from OpenSSL's libcrypto, loaded when first
// needed (libcurl's OpenSSL flavour depends on it anyway) so `sqbox run` does not load it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sqbox {

class Sha256 {
  public:
    Sha256();  // throws Error when libcrypto is missing
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    ~Sha256();

    void update(const void* data, size_t size);
    void update(std::string_view data) { update(data.data(), data.size()); }
    // Lower-case hex of the digest; the object is then spent.
    std::string hex_digest();

  private:
    void* context_;  // EVP_MD_CTX
};

// "sha256:<hex>" of `data`.
std::string sha256_digest(std::string_view data);

// Whether `digest` is "sha256:" and 64 lower-case hex digits: the only algorithm accepted.
bool is_sha256_digest(const std::string& digest);

}  // namespace sqbox

// SHA-256 digests of blobs, in the "sha256:<hex>" form image manifests use.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace sqbox {

class Sha256 {
  public:
    Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    ~Sha256();
    void update(const void* data, size_t size);
    void update(std::string_view data) { update(data.data(), data.size()); }
    // "sha256:<64 lowercase hex digits>"; the object is spent afterwards.
    std::string digest();

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// The digest of everything readable from `fd` (from its current offset to its end).
std::string sha256_of_fd(int fd, const std::string& what);

// "sha256:<hex>" of `data`.
std::string sha256_of(std::string_view data);

// Throws Error "<what>: digest mismatch (expected E, got G)" unless they agree.
void check_digest(const std::string& expected, const std::string& actual, const std::string& what);

// True for "sha256:" followed by 64 lowercase hex digits.
bool is_sha256_digest(const std::string& digest);

}  // namespace sqbox

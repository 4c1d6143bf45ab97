#include "import/sha256.h"

#include <dlfcn.h>

#include <mutex>

#include "util/errors.h"

namespace sqbox {
namespace {

// The few EVP functions used, with OpenSSL's signatures (opaque pointers for its types).
struct Crypto {
    void* (*md_ctx_new)();
    void (*md_ctx_free)(void*);
    const void* (*sha256)();
    int (*digest_init_ex)(void*, const void*, void*);
    int (*digest_update)(void*, const void*, size_t);
    int (*digest_final_ex)(void*, unsigned char*, unsigned int*);
};

template <typename Function>
void resolve(void* handle, const char* name, Function& function) {
    void* symbol = ::dlsym(handle, name);
    if (symbol == nullptr) throw Error(std::string("libcrypto lacks ") + name);
    function = reinterpret_cast<Function>(symbol);
}

const Crypto& crypto() {
    static std::once_flag once;
    static Crypto table;
    std::call_once(once, [] {
        void* handle = nullptr;
        for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1"}) {
            handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (handle != nullptr) break;
        }
        if (handle == nullptr) {
            throw Error("verifying digests needs OpenSSL's libcrypto (Debian: libssl3)");
        }
        resolve(handle, "EVP_MD_CTX_new", table.md_ctx_new);
        resolve(handle, "EVP_MD_CTX_free", table.md_ctx_free);
        resolve(handle, "EVP_sha256", table.sha256);
        resolve(handle, "EVP_DigestInit_ex", table.digest_init_ex);
        resolve(handle, "EVP_DigestUpdate", table.digest_update);
        resolve(handle, "EVP_DigestFinal_ex", table.digest_final_ex);
    });
    return table;
}

}  // namespace

Sha256::Sha256() : context_(crypto().md_ctx_new()) {
    if (context_ == nullptr || crypto().digest_init_ex(context_, crypto().sha256(), nullptr) != 1) {
        throw Error("cannot start a SHA-256 digest");
    }
}

Sha256::~Sha256() {
    crypto().md_ctx_free(context_);
}

void Sha256::update(const void* data, size_t size) {
    if (crypto().digest_update(context_, data, size) != 1) throw Error("SHA-256 update failed");
}

std::string Sha256::hex_digest() {
    unsigned char digest[32];
    unsigned int length = 0;
    if (crypto().digest_final_ex(context_, digest, &length) != 1 || length != sizeof digest) {
        throw Error("SHA-256 final failed");
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    for (unsigned char byte : digest) {
        hex += kHex[byte >> 4];
        hex += kHex[byte & 15];
    }
    return hex;
}

std::string sha256_digest(std::string_view data) {
    Sha256 hash;
    hash.update(data);
    return "sha256:" + hash.hex_digest();
}

bool is_sha256_digest(const std::string& digest) {
    if (digest.size() != 7 + 64 || !digest.starts_with("sha256:")) return false;
    for (size_t i = 7; i < digest.size(); ++i) {
        const char c = digest[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

}  // namespace sqbox

// A hash that is the same in every build and on every machine (unlike std::hash), for names and
// stamps of files that outlive one run.
#pragma once

#include <cstdint>
#include <string_view>

namespace sqbox {

inline constexpr uint64_t kStableHashSeed = 0xcbf29ce484222325ULL;

// FNV-1a, 64 bits: enough to tell inputs apart by accident, not against someone choosing them.
inline uint64_t stable_hash(std::string_view bytes, uint64_t hash = kStableHashSeed) {
    for (unsigned char byte : bytes) {
        hash ^= byte;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

}  // namespace sqbox

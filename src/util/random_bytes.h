// Random bytes from the kernel (getrandom), for keys, challenges and tokens.
#pragma once

#include <array>
#include <cstddef>

namespace sqbox {

// Fills `size` bytes at `data`; throws Error if the kernel gives none.
void fill_random(void* data, size_t size);

template <size_t N>
std::array<unsigned char, N> random_bytes() {
    std::array<unsigned char, N> bytes{};
    fill_random(bytes.data(), bytes.size());
    return bytes;
}

}  // namespace sqbox

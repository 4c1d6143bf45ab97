// The libFuzzer entry point of one target, named by SQBOX_FUZZ_TARGET at compile time.
#include <cstddef>
#include <cstdint>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    sqbox::fuzz::SQBOX_FUZZ_TARGET(data, size);
    return 0;
}

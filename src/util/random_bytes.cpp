#include "util/random_bytes.h"

#include <sys/random.h>

#include <cerrno>

#include "util/errors.h"

namespace sqbox {

void fill_random(void* data, size_t size) {
    auto* bytes = static_cast<unsigned char*>(data);
    size_t filled = 0;
    while (filled < size) {
        const ssize_t got = ::getrandom(bytes + filled, size - filled, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) throw system_error("cannot draw random numbers (getrandom)");
        filled += static_cast<size_t>(got);
    }
}

}  // namespace sqbox

#include "security/capabilities.h"

#include <linux/securebits.h>
#include <sys/capability.h>
#include <sys/prctl.h>

#include <memory>

#include "util/errors.h"

namespace sqbox {

void drop_all_privileges() {
    // Securebits and the bounding set need CAP_SETPCAP, so they go before the sets are cleared.
    constexpr unsigned kSecureBits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                                     SECBIT_NO_CAP_AMBIENT_RAISE |
                                     SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (::cap_set_secbits(kSecureBits) != 0) throw system_error("cannot lock securebits");
    const auto known_caps = static_cast<cap_value_t>(::cap_max_bits());
    for (cap_value_t cap = 0; cap < known_caps; ++cap) {
        if (::cap_drop_bound(cap) != 0) {
            throw system_error("cannot drop the capability bounding set");
        }
    }
    // One call (libcap's cap_reset_ambient first asks about each capability in turn).
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
        throw system_error("cannot clear ambient capabilities");
    }
    std::unique_ptr<std::remove_pointer_t<cap_t>, int (*)(void*)> empty(::cap_init(), ::cap_free);
    if (!empty || ::cap_set_proc(empty.get()) != 0) {
        throw system_error("cannot clear capabilities");
    }
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        throw system_error("cannot set no_new_privs");
    }
}

}  // namespace sqbox

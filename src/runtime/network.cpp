#include "runtime/network.h"

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {

void enter_loopback_only_network() {
    if (::unshare(CLONE_NEWNET) != 0) throw system_error("unshare(CLONE_NEWNET)");
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) throw system_error("cannot create a socket to configure loopback");
    ifreq request{};
    std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
    if (::ioctl(sock.get(), SIOCGIFFLAGS, &request) != 0) {
        throw system_error("cannot read loopback flags");
    }
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP | IFF_RUNNING);
    if (::ioctl(sock.get(), SIOCSIFFLAGS, &request) != 0) {
        throw system_error("cannot bring up loopback");
    }
}

}  // namespace sqbox

// Small messages with descriptors attached (SCM_RIGHTS) over a SOCK_SEQPACKET socket: how the
// launcher and init hand each other things that exist on only one side (the sandbox's cgroup,
// the sandbox terminal's master).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

inline constexpr size_t kMaxPassedFds = 8;

struct FdMessage {
    char tag = 0;  // what the message is, agreed by both sides
    std::string text;
    std::vector<UniqueFd> fds;
};

// A connected pair of SOCK_SEQPACKET sockets (close-on-exec) for such messages.
std::pair<UniqueFd, UniqueFd> make_message_channel(const std::string& purpose);

// Sends one message; throws Error naming `what` on failure.
void send_fd_message(int socket_fd, char tag, std::string_view text, const std::vector<int>& fds,
                     const std::string& what);

// Receives one message (received descriptors are close-on-exec); nullopt when the peer has gone.
std::optional<FdMessage> receive_fd_message(int socket_fd);

}  // namespace sqbox

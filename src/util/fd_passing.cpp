#include "util/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "util/errors.h"

namespace sqbox {
namespace {

// Messages stay well below a socket's default buffer; anything bigger travels in a memfd.
constexpr size_t kMaxText = size_t{64} * 1024;

}  // namespace

std::pair<UniqueFd, UniqueFd> make_message_channel(const std::string& purpose) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
        throw system_error("cannot create " + purpose);
    }
    return {UniqueFd(pair[0]), UniqueFd(pair[1])};
}

void send_fd_message(int socket_fd, MessageTag tag, std::string_view text,
                     const std::vector<int>& fds, const std::string& what) {
    if (fds.size() > kMaxPassedFds) throw Error(what + ": too many descriptors");
    if (text.size() > kMaxText) throw Error(what + ": message too long");
    std::string data(1, static_cast<char>(tag));
    data.append(text);
    iovec vector{data.data(), data.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
    msghdr message{};
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    if (!fds.empty()) {
        message.msg_control = control;
        message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
    }
    if (::sendmsg(socket_fd, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(data.size())) {
        throw system_error(what);
    }
}

namespace {

// One message; its descriptors installed (close-on-exec) if `take_fds`, else dropped by the kernel
// as it delivers the message. `flags` go to recvmsg (MSG_PEEK).
std::optional<FdMessage> receive_message(int socket_fd, bool take_fds, int flags) {
    // Not zeroed: only what recvmsg fills is read (a sandbox's start receives several messages).
    const auto data = std::make_unique_for_overwrite<char[]>(1 + kMaxText);
    iovec vector{data.get(), 1 + kMaxText};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
    msghdr message{};
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    if (take_fds) {
        message.msg_control = control;
        message.msg_controllen = sizeof control;
    }
    ssize_t n = -1;
    do {
        n = ::recvmsg(socket_fd, &message, MSG_CMSG_CLOEXEC | flags);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return std::nullopt;
    FdMessage received;
    received.tag = static_cast<MessageTag>(data[0]);
    received.text.assign(data.get() + 1, static_cast<size_t>(n) - 1);
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
            received.fds.emplace_back(fd);
        }
    }
    return received;
}

}  // namespace

std::optional<FdMessage> receive_fd_message(int socket_fd) {
    return receive_message(socket_fd, true, 0);
}

std::optional<FdMessage> receive_message_without_fds(int socket_fd, bool peek) {
    return receive_message(socket_fd, false, peek ? MSG_PEEK : 0);
}

bool is_request_with_stdio(const std::optional<FdMessage>& message) {
    return message && message->tag == MessageTag::kGo && message->fds.size() == 3;
}

void install_request_stdio(const FdMessage& message) {
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(message.fds.at(static_cast<size_t>(fd)).get(), fd) < 0) {
            throw system_error("cannot set up the sandbox's stdio");
        }
    }
}

}  // namespace sqbox

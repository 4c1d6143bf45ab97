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

// What a message on one of sqbox's channels is: one list for every channel, so that a tag means
// the same wherever it is read.
enum class MessageTag : char {
    kCgroup = 'c',    // launcher -> init (and the serve supervisor -> init): the cgroup's join
                      // files, with the limits the cgroup holds as text
    kFailed = 'e',    // the sender could not do its part; the text says why
    kTerminal = 't',  // init -> launcher: --tty's master
    kStart = 's',     // server -> serve supervisor: start a sandbox (its request, stdio, cgroup)
    kGo = 'g',        // server -> serve supervisor -> pooled init: the request for a pooled sandbox
    kSignal = 'k',    // server -> serve supervisor: signal a sandbox
    kDeadline = 'd',  // server -> serve supervisor: a pre-started sandbox's timeout, from now
    kReady = 'w',     // serve supervisor -> server: the image is mounted
    kReport = 'r',    // serve supervisor -> server: a sandbox has ended
    kImageMount = 'm',      // launcher <-> shared image server: its image's identity; the mount
    kChallenge = 'n',       // shared image server -> launcher: what to prove its key with
    kStalled = 'h',         // supervisor -> shared image server: its image server holds a killed
                            // sandbox (it answers nothing): end it
    kMountNamespace = 'M',  // init -> serve supervisor: the sandbox's mount namespace, which the
                            // supervisor then tears down after reporting the sandbox's end
};

struct FdMessage {
    MessageTag tag{};  // checked by the receiver: any byte may arrive
    std::string text;
    std::vector<UniqueFd> fds;
};

// A connected pair of SOCK_SEQPACKET sockets (close-on-exec) for such messages.
std::pair<UniqueFd, UniqueFd> make_message_channel(const std::string& purpose);

// Sends one message; throws Error naming `what` on failure.
void send_fd_message(int socket_fd, MessageTag tag, std::string_view text,
                     const std::vector<int>& fds, const std::string& what);

// Receives one message (received descriptors are close-on-exec); nullopt when the peer has gone.
std::optional<FdMessage> receive_fd_message(int socket_fd);

// Receives one message from a peer not yet trusted, or with `peek` looks at it and leaves it
// for the next receive: its tag and text, never its descriptors, which the kernel drops as it
// delivers the message. A close() of a descriptor it sent could wait for good, deaf to SIGKILL
// (a file of a FUSE mount whose server never answers the FLUSH that close sends); the kernel's
// drop sends no FLUSH and waits for nothing.
std::optional<FdMessage> receive_message_without_fds(int socket_fd, bool peek = false);

// A pooled sandbox's request (kGo), as init and a payload started early each receive it: its
// text with the request's stdin, stdout and stderr attached, in that order.
bool is_request_with_stdio(const std::optional<FdMessage>& message);

// Puts a request's three descriptors on 0, 1 and 2 (its own copies are closed with `message`).
void install_request_stdio(const FdMessage& message);

}  // namespace sqbox

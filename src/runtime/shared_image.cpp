#include "runtime/shared_image.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/fuse_flushes.h"
#include "runtime/host_probes.h"
#include "runtime/mounts.h"
#include "runtime/rootfs.h"
#include "runtime/server_key.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/supervisor.h"
#include "runtime/user_namespace.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"
#include "util/process.h"
#include "util/stable_hash.h"
#include "util/user_directories.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

// How long a launcher waits for the server's answers (its challenge, then the mount), all told:
// a server just started mounts first.
constexpr int kAnswerWaitMs = 10000;
// How long the server waits for a connected launcher's request before dropping it.
constexpr int kRequestWaitMs = 1000;
// How long a supervisor whose mount is lost waits for the server's word on how its image server
// died.
constexpr int kLostServerWaitMs = 2000;
// How long a launcher waits for room in a busy server's backlog, and for a name that is taken but
// refuses connections to be free or listen: a launcher between its bind and its listen, or a
// server on its way out, take microseconds; a socket that holds the name and never listens (not a
// server of the caller's) costs a launch this much at most.
constexpr int kConnectWaitMs = 1000;
// What an ending server answers the launchers it refuses: they ask again (its successor).
constexpr const char* kServerEnding = "ending after its idle time";
// How long the shared mount has to answer a statfs: a mount that has lost its server says so at
// once, a live server answers as soon as it is free, a stalled one never.
constexpr int kMountProbeWaitMs = 500;
// Descriptors the server keeps besides its sandboxes' connections.
constexpr rlim_t kReservedDescriptors = 16;
// The wait status of a process killed by SIGKILL: the image server's, once it is killed as stalled.
constexpr int kKilledWaitStatus = SIGKILL;

// A small file of /proc the server depends on; throws Error if it cannot be read.
std::string proc_text(const std::string& path) {
    std::optional<std::string> text = read_small_file(path);
    if (!text) throw Error("cannot read " + path);
    return std::move(*text);
}

// The uid the kernel shows for a user that has none in the reader's user namespace. The server's
// namespace maps the caller's uid alone, so every other user's connection reads as this one there:
// a caller whose uid it is (nobody, 65534, as pods and daemons often run) could not tell them
// apart, and gets no shared server.
void require_distinguishable_uid() {
    const std::string text = proc_text("/proc/sys/kernel/overflowuid");
    char* end = nullptr;
    const unsigned long overflow = std::strtoul(text.c_str(), &end, 10);
    if (end == text.c_str()) throw Error("cannot parse /proc/sys/kernel/overflowuid");
    if (::geteuid() == overflow) {
        throw Error("uid " + std::to_string(overflow) +
                    " is the kernel's overflow uid, which every user unknown to the server's user "
                    "namespace shows as");
    }
}

// What a server serves: the image file as it is now, read by this sqbox binary, to callers in
// the cgroups it runs in who asked for its idle time. A different file, a changed one (mtime,
// ctime), another build, another cgroup or another idle time gets a server of its own (a run's
// --image-server-idle holds exactly: a job that asks for 3 s never keeps a server another run
// started for 60); another machine or network namespace never meets it (its name is an abstract
// socket name of the caller's network namespace).
std::string image_identity(const ImageSource& image, unsigned idle_seconds) {
    struct stat file {};
    struct stat binary {};
    if (::fstat(image.file.get(), &file) != 0) throw system_error("cannot stat " + image.path);
    if (::stat("/proc/self/exe", &binary) != 0) throw system_error("cannot stat /proc/self/exe");
    char text[256];
    (void)std::snprintf(
        text, sizeof text, "image %llx:%llx %lld %lld.%ld %lld.%ld sqbox %llx:%llx %lld.%ld",
        static_cast<unsigned long long>(file.st_dev), static_cast<unsigned long long>(file.st_ino),
        static_cast<long long>(file.st_size), static_cast<long long>(file.st_mtim.tv_sec),
        file.st_mtim.tv_nsec, static_cast<long long>(file.st_ctim.tv_sec), file.st_ctim.tv_nsec,
        static_cast<unsigned long long>(binary.st_dev),
        static_cast<unsigned long long>(binary.st_ino),
        static_cast<long long>(binary.st_mtim.tv_sec), binary.st_mtim.tv_nsec);
    // The cgroups: the server runs in the caller's, and whoever ends them ends it (a batch system
    // kills a job's at its end); callers in other cgroups (another job's) get servers nothing of
    // that takes away.
    return text + std::string(" idle ") + std::to_string(idle_seconds) + " cgroups " +
           proc_text("/proc/self/cgroup");
}

// The abstract socket name (in the caller's network namespace) of the caller's server for
// `identity`. Derived, so that the user's launches meet; public (/proc/net/unix lists every
// abstract name), so nothing rests on it being secret: SECURITY.md, "The shared image server".
// The uid in it keeps two users of one identity (same image, binary and cgroups) apart, the
// key's tag two keys of one user (two cache directories).
std::string server_name(const std::string& identity, const ServerKey& key) {
    const std::string owned =
        "uid " + std::to_string(::geteuid()) + " key " + server_key_tag(key) + " " + identity;
    char name[40];
    (void)std::snprintf(name, sizeof name, "sqbox-image-%016llx",
                        static_cast<unsigned long long>(stable_hash(owned)));
    return name;
}

// The address of the abstract name `name`: a leading NUL, then the name's bytes, its length
// in `length` (every byte up to it is part of the name).
sockaddr_un abstract_address(const std::string& name, socklen_t* length) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (name.size() + 1 > sizeof address.sun_path) throw Error("socket name too long: " + name);
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return address;
}

UniqueFd new_socket() {
    UniqueFd socket(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!socket) throw system_error("cannot create a socket for the shared image server");
    return socket;
}

// A connection to the server listening on `name`, or an invalid descriptor when nothing listens
// there (the name is free, or taken by a socket that does not listen).
UniqueFd connect_to_server(const std::string& name) {
    UniqueFd connection = new_socket();
    // A connect to a full backlog waits for room, forever without a time limit (a socket taken
    // by a process that never accepts).
    const timeval limit{kConnectWaitMs / 1000, suseconds_t{kConnectWaitMs % 1000} * 1000};
    if (::setsockopt(connection.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) != 0) {
        throw system_error("setsockopt(SO_SNDTIMEO)");
    }
    socklen_t length = 0;
    const sockaddr_un address = abstract_address(name, &length);
    if (::connect(connection.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0) {
        return connection;
    }
    if (errno == ECONNREFUSED) return {};
    if (errno == EAGAIN) {
        throw Error("the backlog of @" + name + " stayed full for " +
                    std::to_string(kConnectWaitMs) + " ms");
    }
    throw system_error("cannot connect to the shared image server @" + name);
}

// Who is at the other end of `connection` (as the kernel recorded at connect or listen), as this
// process's user and pid namespaces see it; throws Error if it cannot say.
ucred peer_of(int connection) {
    ucred peer{};
    socklen_t size = sizeof peer;
    if (::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0) {
        throw system_error("SO_PEERCRED");
    }
    return peer;
}

// Pid 0: made by a process this pid namespace cannot see, another container's (a pod's
// containers share the network namespace, often the uid, never the pids).
bool in_sight(const ucred& peer) {
    return peer.pid != 0;
}

// The socket that listens on `name` was made to listen by a process of this user: abstract
// names have no owner and no permissions, so any user of the network namespace may have bound it
// first, and nothing such a socket would send is taken. (The kernel records who listened when
// it did; a process of another user shows as its own uid, or the overflow uid, from any user
// namespace it may be in.)
void require_own_server(int connection, const std::string& name) {
    const ucred peer = peer_of(connection);
    if (peer.uid != ::geteuid()) {
        throw Error("its name @" + name + " is held by a socket of uid " +
                    std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) +
                    "), not a server of yours");
    }
    if (!in_sight(peer)) {
        throw Error("its name @" + name +
                    " is held by a socket made outside your pid namespace (another "
                    "container's?), not a server of yours");
    }
}

bool wait_readable(int fd, int timeout_ms) {
    pollfd waiting{fd, POLLIN, 0};
    int ready = 0;
    do {
        ready = ::poll(&waiting, 1, timeout_ms);
    } while (ready < 0 && errno == EINTR);
    return ready > 0;
}

struct MountAnswer {
    bool answered = false;  // else `error` says why not
    int error = 0;
    struct statfs fs {};
};

// `ask` (a statfs of the shared mount), if it is answered within kMountProbeWaitMs. The mount's
// answer waits for its server, which may have stalled (a hostile image can make its parser
// spin): asked on a thread of its own, which ends with this process if it never returns.
template <typename Ask>
std::optional<MountAnswer> statfs_within(Ask ask) {
    auto promise = std::make_shared<std::promise<MountAnswer>>();
    std::future<MountAnswer> answer = promise->get_future();
    std::thread([promise, ask = std::move(ask)]() mutable {
        MountAnswer got;
        got.answered = ask(&got.fs) == 0;
        got.error = errno;
        promise->set_value(got);
    }).detach();
    if (answer.wait_for(std::chrono::milliseconds(kMountProbeWaitMs)) !=
        std::future_status::ready) {
        return std::nullopt;
    }
    return answer.get();
}

// The server's next message on `connection`, its descriptors dropped (or with `peek`, left to
// be received once the message has proven who sent it): nullopt if it is ending (the launcher
// asks again); throws Error if it refused, or said nothing by `deadline`.
std::optional<FdMessage> server_message(int connection, bool peek, Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (!wait_readable(connection, static_cast<int>(std::max<long long>(0, left.count())))) {
        throw Error("the shared image server did not answer in time");
    }
    std::optional<FdMessage> message = receive_message_without_fds(connection, peek);
    if (!message) throw Error("the shared image server hung up");
    if (message->tag == MessageTag::kFailed && message->text == kServerEnding) return std::nullopt;
    if (message->tag == MessageTag::kFailed) {
        throw Error("the shared image server: " + message->text);
    }
    return message;
}

// Asks the server on `connection` for a copy of its mount: nullopt if the server is ending (the
// launcher asks again); throws Error saying why not otherwise. Each end proves it holds the
// user's key (server_key.h) for this launcher's connection before the other trusts it: the
// server answers only a launcher that did, and a mount is taken only from a server that did (no
// descriptor before: closing one that another container sent could wait for good).
std::optional<SharedImage> request_mount(UniqueFd connection, const std::string& identity,
                                         const ServerKey& key, Clock::time_point deadline) {
    const std::optional<FdMessage> challenge = server_message(connection.get(), false, deadline);
    if (!challenge) return std::nullopt;
    if (challenge->tag != MessageTag::kChallenge || challenge->text.size() != kServerKeyBytes) {
        throw Error("unexpected greeting from the shared image server");
    }
    const pid_t self = ::getpid();  // the server sees the connection's pid, this one
    const std::string own_text = key_text(random_key_bytes());
    const std::string request =
        own_text +
        key_text(key_proof(key, ProofRole::kLauncher, identity, self, challenge->text, own_text)) +
        identity;
    send_fd_message(connection.get(), MessageTag::kImageMount, request, {},
                    "the request to the shared image server");
    const std::optional<FdMessage> answer = server_message(connection.get(), true, deadline);
    if (!answer) return std::nullopt;
    if (answer->tag != MessageTag::kImageMount) {
        throw Error("unexpected answer from the shared image server");
    }
    if (!is_key_proof(answer->text, key, ProofRole::kServer, identity, self, own_text,
                      challenge->text)) {
        throw Error(
            "the socket on its name proved no key of yours for this connection (another "
            "container's?)");
    }
    std::optional<FdMessage> proven = receive_fd_message(connection.get());
    if (!proven || proven->fds.size() != 1) {
        throw Error("unexpected answer from the shared image server");
    }
    // What the server sent must be a FUSE mount, and that mount's server must answer: the
    // supervisor would wait on a stalled one (a parser spinning on a hostile image) before the
    // sandbox's timeout counts.
    UniqueFd mount = std::move(proven->fds[0]);
    UniqueFd probed(::fcntl(mount.get(), F_DUPFD_CLOEXEC, 0));
    if (!probed) throw system_error("dup of the shared image mount");
    const std::optional<MountAnswer> probe = statfs_within(
        [probed = std::move(probed)](struct statfs* fs) { return ::fstatfs(probed.get(), fs); });
    if (!probe) throw Error("the shared image mount did not answer in time");
    if (!probe->answered || probe->fs.f_type != FUSE_SUPER_MAGIC) {
        throw Error("the shared image server's answer is not an image mount");
    }
    return SharedImage{std::move(connection), std::move(mount)};
}

void redirect_stdio_to_null() {
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!null) throw system_error("cannot open /dev/null");
    for (int fd = 0; fd <= 2; ++fd) {
        if (::dup2(null.get(), fd) < 0) throw system_error("cannot redirect stdio to /dev/null");
    }
}

// Refuses new launchers on `listener` (their connects fail while this process holds the name,
// which goes with it), then tells those already waiting why this server cannot serve them: they
// ask again if it is ending, else serve their images themselves.
void refuse_waiting_launchers(int listener, const std::string& why) {
    // Only those already waiting: an accept that waited for another would keep this process,
    // and the image's mount, for good.
    if (::shutdown(listener, SHUT_RD) != 0) return;  // the launchers get EOF as it exits
    const int flags = ::fcntl(listener, F_GETFL);
    if (flags < 0 || ::fcntl(listener, F_SETFL, flags | O_NONBLOCK) != 0) return;
    for (;;) {
        UniqueFd connection(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!connection) return;
        // Its request read first if it came (closing on an unread one resets the connection
        // before the launcher reads why): nothing to do if it did not.
        char request[512];
        (void)::recv(connection.get(), request, sizeof request, MSG_DONTWAIT);
        try {
            send_fd_message(connection.get(), MessageTag::kFailed, why, {}, "a refusal");
        } catch (const Error&) {
            // That launcher is gone or gets EOF instead: either way it serves its own image.
        }
    }
}

// One launcher's request: it must run as this server's user, in this server's pid namespace or
// one below it (pid 0: one it cannot see, another container's), its image identity must be this
// server's, and it must prove it holds the user's key for this server's challenge and its own pid
// (as the kernel recorded it at its connect); the answer is a fresh detached copy of the image's
// mount, which is the launcher's to attach, with this server's proof.
bool answer_request(int connection, const std::string& identity, const ServerKey& key) {
    const ucred peer = peer_of(connection);
    if (peer.uid != ::getuid() || !in_sight(peer)) return false;
    const std::string challenge_text = key_text(random_key_bytes());
    send_fd_message(connection, MessageTag::kChallenge, challenge_text, {}, "the challenge");
    if (!wait_readable(connection, kRequestWaitMs)) return false;
    // Its descriptors dropped unread: a close() of one could hold this server for good.
    std::optional<FdMessage> request = receive_message_without_fds(connection);
    if (!request || request->tag != MessageTag::kImageMount ||
        request->text.size() < 2 * kServerKeyBytes) {
        return false;
    }
    const std::string_view text(request->text);
    const std::string_view launchers = text.substr(0, kServerKeyBytes);
    const std::string_view proof = text.substr(kServerKeyBytes, kServerKeyBytes);
    if (text.substr(2 * kServerKeyBytes) != identity) {
        send_fd_message(connection, MessageTag::kFailed, "serves another image", {}, "a refusal");
        return false;
    }
    if (!is_key_proof(proof, key, ProofRole::kLauncher, identity, peer.pid, challenge_text,
                      launchers)) {
        send_fd_message(connection, MessageTag::kFailed,
                        "no proof of the user's key from the process that connected (pid " +
                            std::to_string(peer.pid) + " in the server's pid namespace)",
                        {}, "a refusal");
        return false;
    }
    const std::string own_proof =
        key_text(key_proof(key, ProofRole::kServer, identity, peer.pid, launchers, challenge_text));
    UniqueFd copy = clone_mount_tree(AT_FDCWD, kImageDir, false, "the shared image mount");
    send_fd_message(connection, MessageTag::kImageMount, own_proof, {copy.get()},
                    "the image mount");
    return true;
}

// The word of the image server's death to every sandbox of it: each supervisor ends its sandbox
// with the line a server of its own would give.
void tell_of_death(const std::vector<UniqueFd>& sandboxes, int wait_status) {
    const std::string status = std::to_string(wait_status);
    for (const UniqueFd& sandbox : sandboxes) {
        try {
            send_fd_message(sandbox.get(), MessageTag::kFailed, status, {}, "the news");
        } catch (const Error&) {
            // That sandbox has ended already.
        }
    }
}

// Serves launchers until no sandbox has held the image for `idle`, or the image server is gone.
void serve_launchers(int listener, ChildProcess& server, const std::string& identity,
                     const ServerKey& key, std::chrono::seconds idle) {
    const UniqueFd server_exit = open_pidfd(server.pid());
    if (!server_exit) throw system_error("pidfd_open of the image server");
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) != 0) throw system_error("getrlimit(RLIMIT_NOFILE)");
    files.rlim_cur = files.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &files);  // more sandboxes at once where it is allowed
    const size_t max_sandboxes = files.rlim_cur > 2 * kReservedDescriptors
                                     ? files.rlim_cur - kReservedDescriptors
                                     : kReservedDescriptors;
    std::vector<UniqueFd> sandboxes;
    bool told_of_death = false;
    Clock::time_point idle_until = Clock::now() + idle;
    for (;;) {
        std::vector<pollfd> waiting;
        waiting.push_back({server_exit.get(), POLLIN, 0});
        // At the limit, new launchers wait in the backlog (and time out to serve themselves); so
        // do they once the image server is being killed as stalled (until this server's end).
        const bool takes_launchers = sandboxes.size() < max_sandboxes && !told_of_death;
        waiting.push_back({takes_launchers ? listener : -1, POLLIN, 0});
        for (const UniqueFd& sandbox : sandboxes) waiting.push_back({sandbox.get(), POLLIN, 0});
        int timeout_ms = -1;
        if (sandboxes.empty()) {
            timeout_ms = static_cast<int>(std::max<long long>(
                0,
                std::chrono::ceil<std::chrono::milliseconds>(idle_until - Clock::now()).count()));
        }
        const int ready = ::poll(waiting.data(), waiting.size(), timeout_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) throw system_error("poll in the shared image server");
        if (ready == 0) return;  // idle for long enough
        if (waiting[0].revents != 0) {
            // The image server died (a corrupt image, say): its sandboxes' supervisors end them
            // with the same line a server of their own would give.
            const int status = server.wait();
            if (!told_of_death) tell_of_death(sandboxes, status);
            return;
        }
        // A sandbox's launcher has ended, or its supervisor says that the image server holds
        // its killed sandbox. Nothing else is ever written after the request.
        for (size_t i = sandboxes.size(); i-- > 0;) {
            if (waiting[i + 2].revents == 0) continue;
            const std::optional<FdMessage> word = receive_message_without_fds(sandboxes[i].get());
            if (word && word->tag == MessageTag::kStalled) {
                // The word goes out before the kill: a payload whose request then fails may
                // end at once, and its supervisor must find the word already there, not take
                // the run for a clean one.
                if (!told_of_death) tell_of_death(sandboxes, kKilledWaitStatus);
                told_of_death = true;
                server.send(SIGKILL);
                continue;
            }
            sandboxes.erase(sandboxes.begin() + static_cast<long>(i));
        }
        if (sandboxes.empty()) idle_until = Clock::now() + idle;
        if (waiting[1].revents != 0) {
            UniqueFd connection(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
            if (!connection) continue;
            try {
                if (answer_request(connection.get(), identity, key)) {
                    sandboxes.push_back(std::move(connection));
                }
            } catch (const Error&) {
                // That launcher gets EOF and serves its own image.
            }
        }
    }
}

// The server's process: in a user and mount namespace of its own, it mounts the image, forks the
// confined image server (as a sandbox's supervisor does), and hands out copies of the mount. It
// reads the user's key from `key_fd` only after that fork: the image server parses images that
// may be hostile, and one that took it over could serve what its memory holds to its sandboxes.
[[noreturn]] void run_shared_server(const ImageSource& image, const UniqueFd& listener,
                                    UniqueFd key_fd, const std::string& socket_name,
                                    const std::string& identity, const IdMapping& ids,
                                    std::chrono::seconds idle) {
    std::string why = "did not start";
    try {
        (void)::prctl(PR_SET_NAME, "sqbox-image");
        write_own_id_maps(ids);
        if (::prctl(PR_SET_DUMPABLE, 0) != 0) throw system_error("prctl(PR_SET_DUMPABLE)");
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw system_error("no_new_privs");
        UniqueFd fuse(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
        if (!fuse) throw system_error("cannot open /dev/fuse");
        enter_scratch_root();
        mount_image(image, fuse.get(), ids, FuseUsers::kMountersIds);
        ChildProcess server =
            start_image_server(image, fuse.get(), ids, {listener.get(), key_fd.get()}, nullptr,
                               FileOpens::kWithoutMessages);
        fuse.reset();  // the server's now
        const ServerKey key = read_server_key(key_fd.get());
        key_fd.reset();
        // The name its command line shows is the one it serves: ps and the tests find it by that.
        if (socket_name != "@" + server_name(identity, key)) {
            throw Error("the image server's name " + socket_name + " is not its image's");
        }
        // Before any mount is handed out; this process holds no /dev/fuse (runtime/fuse_flushes.h).
        stop_fuse_flushes(kImageDir);
        serve_launchers(listener.get(), server, identity, key, idle);
        why.clear();
    } catch (const Error& e) {
        why = e.what();
    }
    // The name goes with this process (its last holder of the listening socket), and the image
    // server with it.
    refuse_waiting_launchers(listener.get(), why.empty() ? kServerEnding : why);
    ::_exit(why.empty() ? 0 : kExitSqboxFailure);
}

// The descriptors `sqbox image-server` starts with: the user's key is read from a pipe, to its
// end.
constexpr int kImageFd = 3;
constexpr int kListenerFd = 4;
constexpr int kKeyFd = 5;

// In the child that becomes `sqbox image-server`: `fds` at their numbers above, everything else
// closed, stdio on /dev/null, its own session, no environment. An exec rather than the launcher's
// forked memory: the server holds nothing of this run (its command, environment, config), and
// its command line names no sandbox's.
[[noreturn]] void exec_shared_server(const std::vector<int>& fds, const std::string& socket_name,
                                     unsigned idle_seconds) {
    try {
        (void)::setsid();
        // The launcher's blocked and ignored signals are not the server's: it outlives the run.
        reset_signal_handling();
        redirect_stdio_to_null();
        std::vector<UniqueFd> high;  // first out of the way of the numbers they go to
        for (int fd : fds) {
            high.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 16));
            if (!high.back()) throw system_error("dup");
        }
        for (size_t i = 0; i < high.size(); ++i) {
            if (::dup2(high[i].get(), kImageFd + static_cast<int>(i)) < 0) {
                throw system_error("dup2");
            }
        }
        high.clear();
        close_fds_except({kImageFd, kListenerFd, kKeyFd});
        const std::string idle = std::to_string(idle_seconds);
        const std::string shown = "@" + socket_name;  // as ss and /proc/net/unix show it
        const char* argv[] = {"sqbox",  "image-server", "--socket", shown.c_str(),
                              "--idle", idle.c_str(),   nullptr};
        const char* envp[] = {nullptr};
        ::execve("/proc/self/exe", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    } catch (const Error&) {
        // Below: the launcher finds nobody listening and serves its image itself.
    }
    ::_exit(kExitSqboxFailure);
}

// Takes the name `name` and starts the server listening on it, detached from the caller: it
// outlives this run. The bound name is the lock: no other socket can take it until the server's
// listening socket is closed (as the server exits, or is killed). false if the name is taken.
bool start_shared_server(const ImageSource& image, const SandboxConfig& config,
                         const std::string& name, const ServerKey& key) {
    UniqueFd listener = new_socket();
    socklen_t length = 0;
    const sockaddr_un address = abstract_address(name, &length);
    if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
        if (errno == EADDRINUSE) return false;
        throw system_error("cannot bind @" + name);
    }
    // At once: a name bound and not listening is what a squatter's socket looks like.
    if (::listen(listener.get(), 64) != 0) throw system_error("cannot listen on @" + name);
    // The key fits in the pipe: written whole before the server starts, with nothing to wait for.
    Pipe key_pipe = make_pipe("the image server's key");
    if (!write_all(key_pipe.write_end.get(), key.data(), key.size())) {
        throw system_error("cannot hand the image server its key");
    }
    key_pipe.write_end.reset();
    const pid_t starter = ::fork();
    if (starter < 0) throw system_error("cannot start the shared image server");
    if (starter == 0) {
        exec_shared_server({image.file.get(), listener.get(), key_pipe.read_end.get()}, name,
                           config.image_server_idle_seconds);
    }
    int status = 0;
    while (::waitpid(starter, &status, 0) < 0 && errno == EINTR) {
    }
    return true;
}

// The mount from the server of the image, starting it if no other launcher is doing so: the
// launcher whose bind of the name succeeds starts it; the others connect once it listens.
SharedImage share_from(const ImageSource& image, const SandboxConfig& config) {
    require_distinguishable_uid();
    const ServerKey key = user_server_key(sqbox_cache_directory());
    const std::string identity = image_identity(image, config.image_server_idle_seconds);
    const std::string name = server_name(identity, key);
    const auto started = Clock::now();
    const auto deadline = started + std::chrono::milliseconds(kAnswerWaitMs);
    const auto refusals_end = started + std::chrono::milliseconds(kConnectWaitMs);
    for (;;) {
        if (UniqueFd connection = connect_to_server(name)) {
            require_own_server(connection.get(), name);
            if (std::optional<SharedImage> shared =
                    request_mount(std::move(connection), identity, key, deadline)) {
                return std::move(*shared);
            }
            // That server was ending: its name is free again in a moment.
        } else if (start_shared_server(image, config, name, key)) {
            UniqueFd started_server = connect_to_server(name);
            if (!started_server) throw Error("the shared image server did not start");
            if (std::optional<SharedImage> shared =
                    request_mount(std::move(started_server), identity, key,
                                  Clock::now() + std::chrono::milliseconds(kAnswerWaitMs))) {
                return std::move(*shared);
            }
            throw Error("the shared image server it started ended at once");
        } else if (Clock::now() >= refusals_end) {
            // Taken, and refusing: not a launcher between bind and listen, nor a server on its
            // way out, for this long.
            throw Error("its name @" + name + " is held by a socket that does not listen");
        }
        if (Clock::now() >= deadline) throw Error("no shared image server came up in time");
        ::usleep(2000);
    }
}

}  // namespace

int serve_shared_image(const std::string& socket_name, unsigned idle_seconds) {
    require_distinguishable_uid();  // else answer_request would take every other user for its own
    const UniqueFd listener(kListenerFd);
    const UniqueFd image_fd(kImageFd);
    UniqueFd key_fd(kKeyFd);  // read by the server's process, after it has forked the parser
    const ImageSource image = open_image("/proc/self/fd/" + std::to_string(kImageFd));
    const std::string identity = image_identity(image, idle_seconds);
    // The caller's ids as they are: the mount's owner is the caller's uid in every namespace.
    const IdMapping ids{::getuid(), ::getgid(), ::getuid(), ::getgid()};
    if (clone_into_user_namespace(CLONE_NEWNS, "the shared image server") == 0) {
        run_shared_server(image, listener, std::move(key_fd), socket_name, identity, ids,
                          std::chrono::seconds(idle_seconds));
    }
    return 0;
}

std::optional<SharedImage> share_image(const ImageSource& image, const SandboxConfig& config) {
    if (image.kind != ImageSource::Kind::kSquashfs || config.image_server_idle_seconds == 0) {
        return std::nullopt;
    }
    try {
        return share_from(image, config);
    } catch (const Error& e) {
        if (config.verbose) print_error(std::string("image: serving it alone: ") + e.what());
        return std::nullopt;
    }
}

void signal_when_shared_server_speaks(int connection) {
    sigset_t io;
    sigemptyset(&io);
    sigaddset(&io, SIGIO);
    if (::sigprocmask(SIG_BLOCK, &io, nullptr) != 0) throw system_error("sigprocmask(SIGIO)");
    const int flags = ::fcntl(connection, F_GETFL);
    if (flags < 0 || ::fcntl(connection, F_SETOWN, ::getpid()) != 0 ||
        ::fcntl(connection, F_SETFL, flags | O_ASYNC) != 0) {
        throw system_error("cannot watch the shared image server");
    }
}

std::optional<int> shared_server_death(int connection, int wait_ms) {
    if (!wait_readable(connection, wait_ms)) return std::nullopt;
    const std::optional<FdMessage> news = receive_fd_message(connection);
    if (news && news->tag == MessageTag::kFailed && !news->text.empty() &&
        news->text.find_first_not_of("0123456789") == std::string::npos && news->text.size() < 10) {
        return std::stoi(news->text);
    }
    return SIGKILL;  // a wait status: the server is gone, how it ended unknown
}

std::optional<int> shared_server_death_at_end(int connection) {
    // A payload that failed on the lost mount may end before the server's word arrives; the
    // mount itself says whether there is one to wait for.
    const std::optional<MountAnswer> answer =
        statfs_within([](struct statfs* fs) { return ::statfs(kImageDir, fs); });
    const bool lost = answer && !answer->answered && is_lost_image_server(answer->error);
    return shared_server_death(connection, lost ? kLostServerWaitMs : 0);
}

void report_stalled_shared_server(int connection) {
    send_fd_message(connection, MessageTag::kStalled, {}, {}, "word of the stalled image server");
}

void attach_shared_image(UniqueFd mount) {
    enter_scratch_root();
    attach_mount_at(mount.get(), kImageDir, "the shared image mount");
}

}  // namespace sqbox

#include "import/engine_sources.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <regex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "import/curl_library.h"
#include "import/http_transfers.h"
#include "import/image_import.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/text.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr int64_t kArchiveSlackBytes = int64_t{64} << 20;
constexpr size_t kMaxMessageBytes = 400;
constexpr size_t kMaxErrorBody = size_t{16} * 1024;  // enough for an engine's JSON error
constexpr long kStallSeconds = 600;

bool starts_with(const std::string& text, const std::string& prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr ? std::string(value) : std::string();
}

std::string engine_title(const std::string& engine) {
    return engine == "podman" ? "the podman service" : "the Docker daemon";
}

// `$NAME` when it names a unix socket, empty when unset; an Error for any other scheme.
std::string socket_from_variable(const char* name) {
    const std::string value = environment(name);
    if (value.empty()) return {};
    if (!starts_with(value, "unix://") || value.size() == 7) {
        throw Error(std::string(name) + "=" + value +
                    " is not a unix socket (unix:///PATH); sqbox imports only from a local socket");
    }
    return value.substr(7);
}

// What the engine's answer says, on one line and short: it is the engine's text, not ours.
std::string one_line(const std::string& text) {
    std::string line = blank_controls(text.substr(0, kMaxMessageBytes));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return text.size() > kMaxMessageBytes ? line + "..." : line;
}

// The "message" of the engine's JSON error, else the body's start.
std::string engine_message(const std::string& body) {
    const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
    if (json.is_object()) {
        auto found = json.find("message");
        if (found != json.end() && found->is_string()) return one_line(found->get<std::string>());
    }
    return body.empty() ? "no message" : one_line(body);
}

// Connects once before libcurl does, for a clear line on the usual failures (no engine running,
// a socket only its group may use) instead of libcurl's "Couldn't connect to server".
void check_socket(const std::string& engine, const std::filesystem::path& socket_path) {
    const std::string title = engine_title(engine);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (socket_path.native().size() >= sizeof address.sun_path) {
        throw Error("cannot reach " + title + ": socket path too long: " + socket_path.string());
    }
    std::memcpy(address.sun_path, socket_path.c_str(), socket_path.native().size());
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) throw system_error("cannot create a unix socket");
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
        return;
    }
    const int error = errno;
    const std::string variable = engine == "podman" ? "CONTAINER_HOST" : "DOCKER_HOST";
    if (error == ENOENT) {
        throw Error(
            "cannot reach " + title + ": no socket at " + socket_path.string() +
            (engine == "podman" ? " (is `podman system service` running?" : " (is it running?") +
            " set " + variable + "=unix:///PATH for another)");
    }
    if (error == ECONNREFUSED) {
        throw Error("cannot reach " + title + ": nothing listens on " + socket_path.string());
    }
    throw system_error("cannot reach " + title + " at " + socket_path.string(), error);
}

struct Engine {
    EngineImageReference reference;
    std::filesystem::path socket;

    [[nodiscard]] std::string where() const {
        return engine_title(reference.engine) + " at " + socket.string();
    }
    [[nodiscard]] std::string url(const std::string& operation) const {
        // parse_engine_uri allows only characters a URL path takes as they are.
        return "http://localhost/images/" + reference.image + "/" + operation;
    }
    // An Error for a response that is not 200, with the engine's own reason.
    void check(long status, const std::string& body) const {
        if (status == 200) return;
        const std::string message = engine_message(body);
        if (status == 404) {
            throw Error("image not found: " + reference.image + " (" + where() + ": " + message +
                        ")");
        }
        throw Error(where() + " refused " + reference.image + ": " + message + " (HTTP " +
                    std::to_string(status) + ")");
    }
};

Engine open_engine(const std::string& uri) {
    Engine engine{parse_engine_uri(uri), {}};
    engine.socket = engine_socket_path(engine.reference.engine);
    check_socket(engine.reference.engine, engine.socket);
    return engine;
}

HttpSettings engine_settings() {
    HttpSettings settings;
    settings.allow_http = true;  // a local socket: nothing travels a network
    settings.retries = 0;        // a local engine's failure is not a network's hiccup
    settings.max_connections = 1;
    return settings;
}

EngineImageInfo inspect(const Engine& engine) {
    HttpRequest request;
    request.url = engine.url("json");
    request.what = "the description of " + engine.reference.image + " from " + engine.where();
    request.unix_socket = engine.socket;
    const HttpResponse response = perform_requests({request}, engine_settings()).front();
    engine.check(response.status, response.body);
    const nlohmann::json json = nlohmann::json::parse(response.body, nullptr, false);
    EngineImageInfo info;
    if (json.is_object()) {
        info.id = json.value("Id", std::string());
        const auto size = json.find("Size");
        if (size != json.end() && size->is_number_integer()) info.size = size->get<int64_t>();
        info.architecture = json.value("Architecture", std::string());
    }
    if (!starts_with(info.id, "sha256:") || info.id.size() != 71 || info.size < 0) {
        throw Error(engine.where() + " described " + engine.reference.image +
                    " without an image ID or size");
    }
    return info;
}

// `GET /images/NAME/get`, its body written to a pipe for the archive reader.
struct ArchiveTransfer {
    enum class Stop { none, limit, reader_gone, write_error };

    std::string url;
    std::filesystem::path socket;
    int64_t limit = 0;  // bytes of body allowed
    int fd = -1;        // the pipe's write end
    CURL* easy = nullptr;
    int64_t sent = 0;
    long status = 0;
    std::string error_body;  // of a response other than 200, its start
    Stop stop = Stop::none;
    int write_errno = 0;
    CURLcode code = CURLE_OK;
    char curl_error[CURL_ERROR_SIZE] = {};
};

size_t on_archive_bytes(char* data, size_t size, size_t count, void* user) {
    auto& transfer = *static_cast<ArchiveTransfer*>(user);
    const size_t length = size * count;
    (void)curl_library().easy_getinfo(transfer.easy, CURLINFO_RESPONSE_CODE, &transfer.status);
    if (transfer.status != 200) {
        const size_t room = kMaxErrorBody - std::min(kMaxErrorBody, transfer.error_body.size());
        transfer.error_body.append(data, std::min(room, length));
        // Its start is all that is said: an error that goes on is not read to its end.
        return length <= room ? length : 0;
    }
    if (static_cast<int64_t>(length) > transfer.limit - transfer.sent) {
        transfer.stop = ArchiveTransfer::Stop::limit;
        return 0;  // stops the transfer
    }
    if (!write_all(transfer.fd, data, length)) {
        transfer.write_errno = errno;
        transfer.stop = errno == EPIPE ? ArchiveTransfer::Stop::reader_gone
                                       : ArchiveTransfer::Stop::write_error;
        return 0;
    }
    transfer.sent += static_cast<int64_t>(length);
    return length;
}

void set(CURL* easy, CURLoption option, auto value) {
    if (curl_library().easy_setopt(easy, option, value) != CURLE_OK) {
        throw Error("libcurl rejected an option (" + std::to_string(option) + ")");
    }
}

struct EasyDeleter {
    void operator()(CURL* easy) const { curl_library().easy_cleanup(easy); }
};

// Runs on its own thread: the archive reader takes the bytes as they come.
void send_archive(ArchiveTransfer& transfer, int fd) {
    // A reader that stopped makes writes fail with EPIPE instead of killing the process.
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    if (::pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr) != 0) {
        throw Error("cannot block SIGPIPE for the archive's transfer");
    }
    std::unique_ptr<CURL, EasyDeleter> easy(curl_library().easy_init());
    if (!easy) throw Error("cannot create a libcurl handle");
    transfer.fd = fd;
    transfer.easy = easy.get();
    set(easy.get(), CURLOPT_URL, transfer.url.c_str());
    set(easy.get(), CURLOPT_UNIX_SOCKET_PATH, transfer.socket.c_str());
    set(easy.get(), CURLOPT_NOPROXY, "*");
    set(easy.get(), CURLOPT_PROTOCOLS_STR, "http");
    set(easy.get(), CURLOPT_FOLLOWLOCATION, 0L);
    set(easy.get(), CURLOPT_NOSIGNAL, 1L);
    set(easy.get(), CURLOPT_CONNECTTIMEOUT, 30L);
    // An engine may write the whole archive aside before it sends a byte (podman does).
    set(easy.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
    set(easy.get(), CURLOPT_LOW_SPEED_TIME, kStallSeconds);
    set(easy.get(), CURLOPT_USERAGENT, "sqbox");
    set(easy.get(), CURLOPT_ERRORBUFFER, transfer.curl_error);
    set(easy.get(), CURLOPT_WRITEFUNCTION, &on_archive_bytes);
    set(easy.get(), CURLOPT_WRITEDATA, static_cast<void*>(&transfer));
    transfer.code = curl_library().easy_perform(easy.get());
    (void)curl_library().easy_getinfo(easy.get(), CURLINFO_RESPONSE_CODE, &transfer.status);
}

// Reads `fd` to its end, discarding.
void drain(int fd) {
    std::vector<char> buffer(size_t{64} * 1024);
    for (;;) {
        const ssize_t count = ::read(fd, buffer.data(), buffer.size());
        if (count == 0) return;
        if (count < 0 && errno != EINTR) throw system_error("cannot read the engine's archive");
    }
}

}  // namespace

bool is_engine_image_uri(const std::string& uri) {
    return starts_with(uri, "dockerd://") || starts_with(uri, "podman://");
}

EngineImageReference parse_engine_uri(const std::string& uri) {
    static const std::regex pattern(R"(^(dockerd|podman)://([A-Za-z0-9/._:-]+)$)");
    std::smatch match;
    if (!std::regex_match(uri, match, pattern)) throw Error("Invalid image reference: " + uri);
    EngineImageReference reference{match[1], match[2]};
    // Path components: none empty, none starting with '.' (no "..": the name is a URL path).
    size_t start = 0;
    while (start <= reference.image.size()) {
        size_t end = reference.image.find('/', start);
        if (end == std::string::npos) end = reference.image.size();
        if (end == start || reference.image[start] == '.') {
            throw Error("Invalid image reference: " + uri);
        }
        start = end + 1;
    }
    return reference;
}

std::filesystem::path engine_socket_path(const std::string& engine) {
    if (engine == "dockerd") {
        const std::string socket = socket_from_variable("DOCKER_HOST");
        return socket.empty() ? std::filesystem::path("/var/run/docker.sock")
                              : std::filesystem::path(socket);
    }
    const std::string socket = socket_from_variable("CONTAINER_HOST");
    if (!socket.empty()) return socket;
    if (::geteuid() == 0) return "/run/podman/podman.sock";
    std::string runtime = environment("XDG_RUNTIME_DIR");
    if (runtime.empty()) runtime = "/run/user/" + std::to_string(::geteuid());
    return std::filesystem::path(runtime) / "podman" / "podman.sock";
}

EngineImageInfo inspect_engine_image(const std::string& uri) {
    return inspect(open_engine(uri));
}

std::unique_ptr<LocalImage> open_engine_image(const std::string& uri,
                                              const std::filesystem::path& scratch_directory) {
    const Engine engine = open_engine(uri);
    const EngineImageInfo info = inspect(engine);

    auto local = std::make_unique<LocalImage>();
    const std::filesystem::path scratch = temporary_path_beside(scratch_directory / "x");
    if (::mkdir(scratch.c_str(), 0700) != 0) {
        throw system_error("cannot create the scratch directory " + scratch.string());
    }
    local->scratch = scratch;  // removed with everything in it on every way out

    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw system_error("cannot create a pipe");
    UniqueFd read_end(pipe_fds[0]);
    UniqueFd write_end(pipe_fds[1]);

    // `docker save` holds the layers as the engine stores them (uncompressed, or as pulled, and
    // for a multi-platform image perhaps more than one platform's): room for that, but an
    // endless or runaway stream stops here rather than at a full disk.
    constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
    ArchiveTransfer transfer;
    transfer.url = engine.url("get");
    transfer.socket = engine.socket;
    transfer.limit = info.size > (kLargest - kArchiveSlackBytes) / 2
                         ? kLargest  // a size no disk holds: the disk is the bound
                         : 2 * info.size + kArchiveSlackBytes;
    // The archive streams from the engine through a pipe into the archive reader: its blobs are
    // on disk once, in the scratch directory, never the whole archive besides.
    std::exception_ptr sender_failure;
    std::thread sender([&transfer, &sender_failure, fd = std::move(write_end)]() mutable {
        try {
            send_archive(transfer, fd.get());
        } catch (...) {
            sender_failure = std::current_exception();
        }
        fd.reset();  // the reader's end of file
    });
    std::exception_ptr reader_failure;
    try {
        load_docker_archive_stream(*local, read_end.get(), info.id, uri);
        drain(read_end.get());  // the tar's padding; an endless rest stops at the sender's bound
    } catch (...) {
        reader_failure = std::current_exception();
    }
    read_end.reset();  // a sender still writing gets EPIPE and stops
    sender.join();

    // The sender's failures come first: a reader's error is then only their consequence.
    if (sender_failure) std::rethrow_exception(sender_failure);
    const std::string what = "the archive of " + engine.reference.image + " from " + engine.where();
    if (transfer.status != 0 && transfer.status != 200) {
        engine.check(transfer.status, transfer.error_body);
    }
    switch (transfer.stop) {
        case ArchiveTransfer::Stop::limit:
            throw Error(what + " is larger than " + std::to_string(transfer.limit) +
                        " bytes (twice the image's size as the engine reports it, plus 64 MiB)");
        case ArchiveTransfer::Stop::write_error:
            throw system_error("cannot pass on " + what, transfer.write_errno);
        case ArchiveTransfer::Stop::reader_gone:
            break;  // the reader stopped on its own error, below
        case ArchiveTransfer::Stop::none:
            if (transfer.code != CURLE_OK) {
                throw Error("cannot fetch " + what + ": " +
                            (transfer.curl_error[0] != '\0'
                                 ? std::string(transfer.curl_error)
                                 : std::string(curl_library().easy_strerror(transfer.code))));
            }
            break;
    }
    if (reader_failure) std::rethrow_exception(reader_failure);
    return local;
}

}  // namespace sqbox

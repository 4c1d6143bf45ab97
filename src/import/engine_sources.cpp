#include "import/engine_sources.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <regex>

#include <nlohmann/json.hpp>

#include "import/http_transfers.h"
#include "import/image_import.h"
#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr int64_t kArchiveSlackBytes = int64_t{64} << 20;
constexpr size_t kMaxMessageBytes = 400;

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
    std::string line;
    for (const char c : text.substr(0, kMaxMessageBytes)) {
        line += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c;
    }
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
    void check(const HttpResponse& response) const {
        if (response.status == 200) return;
        const std::string message = engine_message(response.body);
        if (response.status == 404) {
            throw Error("image not found: " + reference.image + " (" + where() + ": " + message +
                        ")");
        }
        throw Error(where() + " refused " + reference.image + ": " + message + " (HTTP " +
                    std::to_string(response.status) + ")");
    }
};

Engine open_engine(const std::string& uri) {
    Engine engine{parse_engine_uri(uri), {}};
    engine.socket = engine_socket_path(engine.reference.engine);
    check_socket(engine.reference.engine, engine.socket);
    return engine;
}

HttpSettings engine_settings(long stall_timeout) {
    HttpSettings settings;
    settings.allow_http = true;  // a local socket: nothing travels a network
    settings.retries = 0;        // a local engine's failure is not a network's hiccup
    settings.max_connections = 1;
    settings.stall_timeout = stall_timeout;
    return settings;
}

EngineImageInfo inspect(const Engine& engine) {
    HttpRequest request;
    request.url = engine.url("json");
    request.what = "the description of " + engine.reference.image + " from " + engine.where();
    request.unix_socket = engine.socket;
    const HttpResponse response = perform_requests({request}, engine_settings(60)).front();
    engine.check(response);
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
    const std::filesystem::path archive = scratch / "image.tar";
    UniqueFd fd(::open(archive.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) throw system_error("cannot create " + archive.string());

    HttpRequest request;
    request.url = engine.url("get");
    request.what = "the archive of " + engine.reference.image + " from " + engine.where();
    request.unix_socket = engine.socket;
    request.body_fd = fd.get();
    request.digest_body = false;  // the archive has no digest; each blob in it is checked
    // `docker save` holds the layers as the engine stores them (uncompressed, or as pulled, and
    // for a multi-platform image perhaps more than one platform's): room for that, but an
    // endless or runaway stream stops here rather than at a full disk.
    constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
    request.max_body_size = info.size > (kLargest - kArchiveSlackBytes) / 2
                                ? kLargest  // a size no disk holds: the disk is the bound
                                : 2 * info.size + kArchiveSlackBytes;
    // An engine may write the whole archive aside before it sends a byte (podman does).
    const HttpResponse response = perform_requests({request}, engine_settings(600)).front();
    engine.check(response);
    fd.reset();
    load_docker_archive(*local, archive, info.id, uri);
    return local;
}

}  // namespace sqbox

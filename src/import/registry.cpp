#include "import/registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "import/blob_cache.h"
#include "import/docker_reference.h"
#include "import/http_transfers.h"
#include "import/image_manifest.h"
#include "import/registry_credentials.h"
#include "import/sha256.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr int64_t kMaxManifestSize = 4 << 20;  // the limit registries apply to manifests
constexpr int64_t kMaxConfigSize = 16 << 20;
constexpr int64_t kMaxTokenResponse = 1 << 20;

std::string read_optional_file(const std::filesystem::path& path, const std::string& what) {
    if (path.empty()) return "";
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
        if (errno == ENOENT || errno == ENOTDIR) return "";
        throw system_error("cannot read " + what + " " + path.string());
    }
    return read_bounded_regular_file(fd.get(), 1 << 20, what + " " + path.string());
}

// The registry's own words from a JSON error body ({"errors":[{"code","message"}]}), if any.
std::string registry_message(const HttpResponse& response) {
    try {
        const auto body = nlohmann::json::parse(response.body);
        const auto& first = body.at("errors").at(0);
        return first.value("code", "") + ": " + first.value("message", "");
    } catch (const nlohmann::json::exception&) {
        return "";
    }
}

std::string status_error(const HttpResponse& response, const std::string& what) {
    const std::string message = registry_message(response);
    return "the registry answered HTTP " + std::to_string(response.status) + " for " + what +
           (message.empty() ? "" : " (" + message + ")");
}

// One pull's conversation with one registry: its base URL, the credentials it may be sent and
// the Authorization it granted.
class RegistrySession {
  public:
    RegistrySession(DockerReference reference, const RegistryOptions& options)
        : reference_(std::move(reference)), options_(options) {
        http_.allow_http = options.allow_http;
        http_.connect_timeout = options.connect_timeout;
        http_.transfer_timeout = options.transfer_timeout;
        http_.stall_timeout = options.stall_timeout;
        http_.retries = options.retries;
        http_.max_connections = options.max_connections;
        base_ = std::string(options.allow_http ? "http" : "https") + "://" + reference_.registry +
                "/v2/" + reference_.image + "/";
        origin_ = url_origin(base_);
        if (!options.config_dir.empty()) {
            netrc_ = parse_netrc(
                read_optional_file(options.config_dir / ".credentials", "the credentials file"));
        }
        docker_config_ = read_optional_file(
            options.docker_config.empty() ? docker_config_path() : options.docker_config,
            "Docker's config file");
        // enroot takes the user from the credentials file when the URI names none.
        if (reference_.user.empty()) {
            reference_.user = netrc_user_for(netrc_, registry_host(reference_.registry));
        }
    }

    [[nodiscard]] const DockerReference& reference() const { return reference_; }

    // GETs (or HEADs) `path` under the repository, authenticating when challenged.
    HttpResponse get(const std::string& path, const std::string& what, bool head = false) {
        HttpRequest request = make_request(path, what);
        request.head = head;
        request.headers.push_back(std::string("Accept: ") + kManifestAccept);
        request.max_body_size = kMaxManifestSize;
        return perform_authenticated({request}).front();
    }

    HttpRequest make_request(const std::string& path, const std::string& what) const {
        HttpRequest request;
        request.url = base_ + path;
        request.what = what;
        request.authorization = authorization_;
        request.authorization_origin = origin_;
        return request;
    }

    // Performs `requests`; those answered 401 are repeated once after authenticating with the
    // challenge (a first request, or a token that expired during a long pull).
    std::vector<HttpResponse> perform_authenticated(std::vector<HttpRequest> requests) {
        std::vector<HttpResponse> responses = perform_requests(requests, http_);
        std::vector<size_t> refused;
        for (size_t i = 0; i < responses.size(); ++i) {
            if (responses[i].status == 401) refused.push_back(i);
        }
        if (refused.empty()) return responses;
        authenticate(responses[refused.front()]);
        std::vector<HttpRequest> again;
        for (size_t i : refused) {
            again.push_back(requests[i]);
            again.back().authorization = authorization_;
        }
        std::vector<HttpResponse> second = perform_requests(again, http_);
        for (size_t i = 0; i < refused.size(); ++i) {
            if (second[i].status == 401) {
                throw Error("the registry " + reference_.registry + " refused access to " +
                            reference_.image + " with " + credential_description_ + " (HTTP 401)");
            }
            responses[refused[i]] = std::move(second[i]);
        }
        return responses;
    }

    // Reports body bytes to `report` until the returned guard goes.
    [[nodiscard]] auto report_bytes(std::function<void(uint64_t)> report) {
        http_.on_bytes = std::move(report);
        auto stop = [](HttpSettings* settings) { settings->on_bytes = nullptr; };
        return std::unique_ptr<HttpSettings, decltype(stop)>(&http_, stop);
    }

  private:
    // Credentials for requests to `host`: enroot's .credentials first (the entry for that host),
    // then Docker's config for the registry. `required` when the URI named a user.
    std::optional<Credentials> credentials_for(const std::string& host) {
        if (auto found = netrc_credentials(netrc_, host, reference_.user)) return found;
        if (host != registry_host(reference_.registry)) {
            if (auto found = netrc_credentials(netrc_, registry_host(reference_.registry),
                                               reference_.user)) {
                return found;
            }
        }
        if (!docker_config_.empty()) {
            if (auto found = docker_config_credentials(docker_config_, reference_.registry,
                                                       reference_.user)) {
                return found;
            }
        }
        if (!reference_.user.empty()) {
            throw Error("no password for " + reference_.user + " at " + host + ": add `machine " +
                        host + " login " + reference_.user + " password …` to " +
                        (options_.config_dir / ".credentials").string());
        }
        return std::nullopt;
    }

    void authenticate(const HttpResponse& unauthorized) {
        if (!authorization_.empty()) {
            // Already authenticated: the grant expired or does not cover this request.
            authorization_.clear();
        }
        const auto header = unauthorized.headers.find("www-authenticate");
        const auto challenge = header == unauthorized.headers.end()
                                   ? std::nullopt
                                   : parse_www_authenticate(header->second);
        if (!challenge) {
            throw Error("the registry " + reference_.registry +
                        " answered HTTP 401 without a usable WWW-Authenticate challenge");
        }
        std::string scheme = challenge->scheme;
        for (auto& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (scheme == "basic") {
            const auto credentials = credentials_for(registry_host(reference_.registry));
            if (!credentials) {
                throw Error("the registry " + reference_.registry +
                            " requires credentials: add them to " +
                            (options_.config_dir / ".credentials").string() +
                            " or log in with docker login");
            }
            authorization_ =
                "Basic " + base64_encode(credentials->user + ":" + credentials->password);
            credential_description_ = "the credentials of " + credentials->user;
        } else if (scheme == "bearer") {
            authorization_ = "Bearer " + fetch_token(*challenge);
        } else {
            throw Error("the registry " + reference_.registry +
                        " asks for an unsupported authentication method: " + challenge->scheme);
        }
    }

    std::string fetch_token(const AuthChallenge& challenge) {
        const auto realm = challenge.parameters.find("realm");
        if (realm == challenge.parameters.end() || realm->second.empty()) {
            throw Error("could not parse the authentication realm of " + reference_.registry);
        }
        std::vector<std::pair<std::string, std::string>> query;
        for (const auto& [name, value] : challenge.parameters) {
            if (name != "realm") query.emplace_back(name, value);
        }
        HttpRequest request;
        request.url = url_with_query(realm->second, query);
        request.what = "a token from " + realm->second;
        request.max_body_size = kMaxTokenResponse;
        const std::string realm_origin = url_origin(realm->second);
        const std::string realm_host = realm_origin.substr(
            realm_origin.find("://") + 3, realm_origin.rfind(':') - realm_origin.find("://") - 3);
        const auto credentials = credentials_for(realm_host);
        credential_description_ = "an anonymous token";
        if (credentials) {
            request.authorization =
                "Basic " + base64_encode(credentials->user + ":" + credentials->password);
            request.authorization_origin = realm_origin;
            credential_description_ = "a token for " + credentials->user;
        }
        const HttpResponse response = perform_requests({request}, http_).front();
        if (response.status == 401 || response.status == 403) {
            throw Error("the token server " + realm->second + " refused " +
                        (credentials ? "the credentials of " + credentials->user
                                     : std::string("an anonymous request")) +
                        " (HTTP " + std::to_string(response.status) + ")");
        }
        if (response.status != 200) throw Error(status_error(response, request.what));
        try {
            const auto body = nlohmann::json::parse(response.body);
            for (const char* field : {"token", "access_token"}) {
                if (body.contains(field) && body[field].is_string() &&
                    !body[field].get<std::string>().empty()) {
                    return body[field].get<std::string>();
                }
            }
        } catch (const nlohmann::json::exception&) {
        }
        throw Error("the token server " + realm->second + " answered without a token");
    }

    DockerReference reference_;
    const RegistryOptions& options_;
    HttpSettings http_;
    std::string base_;
    std::string origin_;
    std::vector<NetrcEntry> netrc_;
    std::string docker_config_;
    std::string authorization_;
    std::string credential_description_ = "no credentials";
};

struct ResolvedManifest {
    ParsedManifest manifest;
    std::string digest;
};

// Fetches the manifest `reference` names, checks its digest, and follows a manifest list to the
// requested architecture's manifest.
ResolvedManifest resolve_manifest(RegistrySession& session, const RegistryOptions& options) {
    const DockerReference& reference = session.reference();
    const std::string architecture = normalize_architecture(options.architecture);
    std::string wanted = reference.reference;
    std::string what = "the manifest of " + reference.display();
    for (int depth = 0; depth < 2; ++depth) {
        const HttpResponse response = session.get("manifests/" + wanted, what);
        if (response.status == 404) {
            throw Error("image not found: " + reference.display() +
                        (registry_message(response).empty()
                             ? ""
                             : " (" + registry_message(response) + ")"));
        }
        if (response.status != 200) throw Error(status_error(response, what));
        const std::string digest = sha256_of(response.body);
        const auto advertised = response.headers.find("docker-content-digest");
        if (wanted.starts_with("sha256:")
                ? digest != wanted
                : (advertised != response.headers.end() && advertised->second != digest)) {
            throw Error(what + " does not match its digest (" +
                        (wanted.starts_with("sha256:") ? wanted : advertised->second) +
                        ", received " + digest + ")");
        }
        const auto content_type = response.headers.find("content-type");
        ParsedManifest manifest = parse_manifest(
            response.body, content_type == response.headers.end() ? "" : content_type->second,
            what);
        if (!manifest.is_index) return {std::move(manifest), digest};
        const PlatformEntry& entry = select_platform(manifest, architecture, what);
        wanted = entry.manifest.digest;
        what = "the linux/" + architecture + " manifest of " + reference.display();
    }
    throw Error("the manifest list of " + reference.display() + " points to another list");
}

// A one-line progress display on stderr, updated at most ten times a second.
class Progress {
  public:
    Progress(bool enabled, size_t blobs, uint64_t total)
        : enabled_(enabled), blobs_(blobs), total_(total) {}
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;
    ~Progress() {
        if (enabled_ && shown_) (void)std::fputs("\r\033[K", stderr);  // a terminal: best effort
    }
    void add(uint64_t bytes) {
        received_ += bytes;
        const auto now = std::chrono::steady_clock::now();
        if (!enabled_ || now - last_ < std::chrono::milliseconds(100)) return;
        last_ = now;
        shown_ = true;
        (void)std::fprintf(stderr, "\rsqbox: downloading %zu blob%s: %.1f / %.1f MB\033[K", blobs_,
                           blobs_ == 1 ? "" : "s", static_cast<double>(received_) / 1e6,
                           static_cast<double>(total_) / 1e6);
        (void)std::fflush(stderr);
    }

  private:
    bool enabled_;
    size_t blobs_;
    uint64_t total_;
    uint64_t received_ = 0;
    bool shown_ = false;
    std::chrono::steady_clock::time_point last_{};
};

// Downloads the blobs the cache lacks, in parallel, each verified against its digest and size
// before it gets its name in the cache.
void download_missing(RegistrySession& session, const BlobCache& cache,
                      const std::vector<std::pair<Descriptor, std::string>>& blobs,
                      const RegistryOptions& options) {
    std::vector<BlobCache::Pending> pending;
    std::vector<HttpRequest> requests;
    std::vector<const Descriptor*> descriptors;
    uint64_t total = 0;
    for (const auto& [descriptor, what] : blobs) {
        if (cache.contains(descriptor.digest)) continue;
        bool duplicate = false;  // one layer may appear twice in a manifest
        for (const Descriptor* other : descriptors) duplicate |= other->digest == descriptor.digest;
        if (duplicate) continue;
        pending.push_back(cache.begin(descriptor.digest));
        HttpRequest request = session.make_request("blobs/" + descriptor.digest, what);
        request.body_fd = pending.back().fd();
        request.max_body_size = descriptor.size;
        requests.push_back(std::move(request));
        descriptors.push_back(&descriptor);
        total += static_cast<uint64_t>(descriptor.size);
    }
    if (requests.empty()) return;
    Progress progress(options.progress, requests.size(), total);
    const auto reporting =
        session.report_bytes([&progress](uint64_t bytes) { progress.add(bytes); });
    const std::vector<HttpResponse> responses = session.perform_authenticated(requests);
    for (size_t i = 0; i < responses.size(); ++i) {
        const HttpResponse& response = responses[i];
        const Descriptor& descriptor = *descriptors[i];
        const std::string& what = requests[i].what;
        if (response.status != 200) throw Error(status_error(response, what));
        if (response.body_size != static_cast<uint64_t>(descriptor.size)) {
            throw Error(what + " is truncated: " + std::to_string(response.body_size) + " of " +
                        std::to_string(descriptor.size) + " bytes received");
        }
        if (response.body_digest != descriptor.digest) {
            throw Error(what + " does not match its digest (received " + response.body_digest +
                        ")");
        }
    }
    for (auto& blob : pending) blob.commit();
}

nlohmann::json read_config(const BlobCache& cache, const Descriptor& config) {
    UniqueFd fd(::open(cache.path_of(config.digest).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw system_error("cannot open the image configuration " + config.digest);
    const std::string text =
        read_bounded_regular_file(fd.get(), kMaxConfigSize, "the image configuration");
    try {
        auto parsed = nlohmann::json::parse(text);
        if (!parsed.is_object()) throw Error("the image configuration is not a JSON object");
        return parsed;
    } catch (const nlohmann::json::exception&) {
        throw Error("the image configuration " + config.digest + " is not valid JSON");
    }
}

long environment_number(const char* name, long current) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return current;
    char* end = nullptr;
    errno = 0;
    const long number = std::strtol(value, &end, 10);
    if (errno != 0 || *end != '\0' || number < 0 || number > 1000000) {
        throw Error(std::string(name) + " must be a non-negative integer, not \"" + value + "\"");
    }
    return number;
}

}  // namespace

void apply_enroot_transfer_settings(RegistryOptions& options) {
    options.connect_timeout = environment_number("ENROOT_CONNECT_TIMEOUT", options.connect_timeout);
    options.transfer_timeout =
        environment_number("ENROOT_TRANSFER_TIMEOUT", options.transfer_timeout);
    options.retries =
        static_cast<int>(environment_number("ENROOT_TRANSFER_RETRIES", options.retries));
    options.max_connections =
        static_cast<int>(environment_number("ENROOT_MAX_CONNECTIONS", options.max_connections));
}

ImageLayers pull_from_registry(const std::string& uri, const RegistryOptions& options) {
    if (options.cache_dir.empty()) throw Error("no cache directory for the image's layers");
    RegistrySession session(parse_docker_uri(uri), options);
    ResolvedManifest resolved = resolve_manifest(session, options);
    const ParsedManifest& manifest = resolved.manifest;
    if (manifest.config.size > kMaxConfigSize) {
        throw Error("the image configuration of " + session.reference().display() +
                    " is too large (" + std::to_string(manifest.config.size) + " bytes)");
    }
    const BlobCache cache(options.cache_dir);
    std::vector<std::pair<Descriptor, std::string>> blobs;
    blobs.emplace_back(manifest.config, "the image configuration " + manifest.config.digest);
    for (const auto& layer : manifest.layers) blobs.emplace_back(layer, "layer " + layer.digest);
    download_missing(session, cache, blobs, options);

    ImageLayers image;
    image.manifest_digest = resolved.digest;
    image.config = read_config(cache, manifest.config);
    for (const auto& layer : manifest.layers) {
        image.layers.push_back({cache.path_of(layer.digest), layer.media_type, layer.digest});
    }
    return image;
}

std::string registry_digest(const std::string& uri, const RegistryOptions& options) {
    RegistrySession session(parse_docker_uri(uri), options);
    return resolve_manifest(session, options).digest;
}

}  // namespace sqbox

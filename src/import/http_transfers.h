// HTTP GETs for the registry client over libcurl's multi interface: several at once, each
// following redirects itself so the registry's Authorization never reaches another host, retried
// on transient failures, bounded in size and time, bodies streamed into files with their SHA-256.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace sqbox {

struct HttpSettings {
    bool allow_http = false;    // plain http:// besides https:// (ENROOT_ALLOW_HTTP)
    long connect_timeout = 30;  // seconds, 0: none (ENROOT_CONNECT_TIMEOUT)
    long transfer_timeout = 0;  // seconds per request, 0: none (ENROOT_TRANSFER_TIMEOUT)
    long stall_timeout = 60;    // seconds without a byte before a transfer counts as failed
    int retries = 2;            // further attempts after a transient failure
    int max_connections = 10;   // transfers at once, 0: no limit (ENROOT_MAX_CONNECTIONS)
    int max_redirects = 10;
    std::function<void(uint64_t)> on_bytes;  // body bytes as they arrive (progress)
};

struct HttpRequest {
    std::string url;
    std::string what;                  // for messages: "the manifest of …", "layer sha256:…"
    std::vector<std::string> headers;  // "Name: value", sent to every host
    std::string authorization;         // the Authorization value, only for `authorization_origin`
    std::string authorization_origin;  // scheme://host:port the credentials belong to
    bool head = false;
    // A local daemon's unix socket to send the request to instead of the URL's host (an http://
    // URL; proxies never apply).
    std::string unix_socket;
    // Where a successful (2xx) body goes: the file `body_fd` (rewound on each attempt) with its
    // SHA-256 computed on the way, or memory up to `max_body_size` bytes.
    int body_fd = -1;
    int64_t max_body_size = 4 << 20;  // for a file: its declared size, -1 unknown
};

struct HttpResponse {
    long status = 0;
    std::map<std::string, std::string> headers;  // lower-case names, of the final response
    std::string body;                            // memory body, or the start of an error body
    std::string body_digest;                     // "sha256:<hex>" of a file body
    uint64_t body_size = 0;
    std::string url;  // after redirects
};

// Performs `requests` at once and returns their final responses in order (4xx and 5xx included,
// after retries). Throws Error with one line naming the request's `what` on transport failures,
// timeouts, too many redirects, a redirect to plain HTTP without allow_http, and bodies larger
// than allowed.
std::vector<HttpResponse> perform_requests(const std::vector<HttpRequest>& requests,
                                           const HttpSettings& settings);

// scheme://host:port of `url` (the port made explicit). Throws Error for a malformed URL.
std::string url_origin(const std::string& url);

// `url` with `name=value` query parameters appended, encoded.
std::string url_with_query(const std::string& url,
                           const std::vector<std::pair<std::string, std::string>>& parameters);

}  // namespace sqbox

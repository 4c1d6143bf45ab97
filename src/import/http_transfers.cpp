#include "import/http_transfers.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "import/curl_library.h"
#include "import/sha256.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = size_t{16} * 1024;  // enough for a registry's JSON error

struct CurlUrlDeleter {
    void operator()(CURLU* url) const { curl_library().url_cleanup(url); }
};
using CurlUrl = std::unique_ptr<CURLU, CurlUrlDeleter>;

std::string url_part(const CurlUrl& url, CURLUPart part, unsigned flags = 0) {
    char* text = nullptr;
    if (curl_library().url_get(url.get(), part, &text, flags) != CURLUE_OK || text == nullptr) {
        return "";
    }
    std::string result(text);
    curl_library().free(text);
    return result;
}

CurlUrl parse_url(const std::string& url) {
    CurlUrl handle(curl_library().url());
    if (!handle) throw Error("out of memory parsing a URL");
    if (curl_library().url_set(handle.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
        throw Error("invalid URL: " + url);
    }
    return handle;
}

// `location` (absolute or relative) resolved against `base`.
std::string resolve_location(const std::string& base, const std::string& location) {
    CurlUrl handle = parse_url(base);
    if (curl_library().url_set(handle.get(), CURLUPART_URL, location.c_str(), 0) != CURLUE_OK) {
        throw Error("invalid redirect location: " + location);
    }
    return url_part(handle, CURLUPART_URL);
}

bool transient(CURLcode code) {
    switch (code) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
        case CURLE_PARTIAL_FILE:
        case CURLE_GOT_NOTHING:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
            return true;
        default:
            return false;
    }
}

bool transient_status(long status) {
    return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
           status == 504;
}

struct EasyDeleter {
    void operator()(CURL* easy) const { curl_library().easy_cleanup(easy); }
};
struct SlistDeleter {
    void operator()(curl_slist* list) const { curl_library().slist_free_all(list); }
};

// One request's progress through its attempts and redirects.
struct Transfer {
    const HttpRequest* request = nullptr;
    size_t index = 0;
    std::string url;  // the current hop
    int attempt = 0;
    int redirects = 0;
    Clock::time_point not_before{};

    std::unique_ptr<CURL, EasyDeleter> easy;
    std::unique_ptr<curl_slist, SlistDeleter> headers;
    std::optional<Sha256> hash;
    HttpResponse response;
    std::string failure;  // set by a callback that stopped the transfer
    char curl_error[CURL_ERROR_SIZE] = {};
    const HttpSettings* settings = nullptr;

    [[nodiscard]] bool success_body() const {
        return response.status >= 200 && response.status < 300;
    }
};

long current_status(Transfer& transfer) {
    long status = 0;
    (void)curl_library().easy_getinfo(transfer.easy.get(), CURLINFO_RESPONSE_CODE, &status);
    return status;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
    auto& transfer = *static_cast<Transfer*>(user);
    std::string line(data, size * count);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.starts_with("HTTP/")) {
        transfer.response.headers.clear();  // a new response (after 100 Continue, say)
    } else if (const auto colon = line.find(':'); colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        size_t start = colon + 1;
        while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
        transfer.response.headers[name] = line.substr(start);
    }
    return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
    auto& transfer = *static_cast<Transfer*>(user);
    const size_t length = size * count;
    const HttpRequest& request = *transfer.request;
    const long status = current_status(transfer);
    if (status < 200 || status >= 300) {
        // An error page or a redirect's body: keep what a message may quote.
        const size_t room = kMaxErrorBody - std::min(kMaxErrorBody, transfer.response.body.size());
        transfer.response.body.append(data, std::min(room, length));
        return length;
    }
    const uint64_t total = transfer.response.body_size + length;
    if (request.max_body_size >= 0 && total > static_cast<uint64_t>(request.max_body_size)) {
        transfer.failure =
            request.body_fd >= 0
                ? "is larger than its declared size of " + std::to_string(request.max_body_size) +
                      " bytes"
                : "is larger than the limit of " + std::to_string(request.max_body_size) + " bytes";
        return 0;  // stops the transfer with CURLE_WRITE_ERROR
    }
    if (request.body_fd >= 0) {
        if (!write_all(request.body_fd, data, length)) {
            transfer.failure = std::string("cannot be written to the cache: ") +
                               system_error("write", errno).what();
            return 0;
        }
        transfer.hash->update(data, length);
    } else {
        transfer.response.body.append(data, length);
    }
    transfer.response.body_size = total;
    if (transfer.settings->on_bytes) transfer.settings->on_bytes(length);
    return length;
}

void check_scheme(const std::string& url, const HttpSettings& settings, const std::string& what) {
    const std::string scheme = url_part(parse_url(url), CURLUPART_SCHEME);
    if (scheme == "https" || (scheme == "http" && settings.allow_http)) return;
    if (scheme == "http") {
        throw Error("refusing plain HTTP for " + what + " (" + url +
                    "); set ENROOT_ALLOW_HTTP=y to allow it");
    }
    throw Error("unsupported URL scheme for " + what + ": " + url);
}

void set(CURL* easy, CURLoption option, auto value) {
    if (curl_library().easy_setopt(easy, option, value) != CURLE_OK) {
        throw Error("libcurl rejected an option (" + std::to_string(option) + ")");
    }
}

// Prepares a fresh easy handle for the transfer's current URL.
void start_attempt(Transfer& transfer) {
    const HttpRequest& request = *transfer.request;
    const HttpSettings& settings = *transfer.settings;
    check_scheme(transfer.url, settings, request.what);
    transfer.response = HttpResponse{};
    transfer.failure.clear();
    transfer.curl_error[0] = '\0';
    if (request.body_fd >= 0) {
        if (::ftruncate(request.body_fd, 0) != 0 || ::lseek(request.body_fd, 0, SEEK_SET) != 0) {
            throw system_error("cannot rewind the download of " + request.what);
        }
        transfer.hash.emplace();
    }
    transfer.easy.reset(curl_library().easy_init());
    if (!transfer.easy) throw Error("cannot create a libcurl handle");
    curl_slist* list = nullptr;
    auto append = [&](const std::string& header) {
        curl_slist* extended = curl_library().slist_append(list, header.c_str());
        if (extended == nullptr) {
            curl_library().slist_free_all(list);
            throw Error("out of memory for HTTP headers");
        }
        list = extended;
    };
    for (const auto& header : request.headers) append(header);
    // The credentials are the registry's: never sent to blob storage elsewhere.
    if (!request.authorization.empty() &&
        url_origin(transfer.url) == request.authorization_origin) {
        append("Authorization: " + request.authorization);
    }
    transfer.headers.reset(list);
    CURL* easy = transfer.easy.get();
    set(easy, CURLOPT_URL, transfer.url.c_str());
    set(easy, CURLOPT_HTTPHEADER, list);
    set(easy, CURLOPT_PROTOCOLS_STR, settings.allow_http ? "http,https" : "https");
    set(easy, CURLOPT_FOLLOWLOCATION, 0L);
    set(easy, CURLOPT_NOSIGNAL, 1L);
    set(easy, CURLOPT_CONNECTTIMEOUT, settings.connect_timeout);
    set(easy, CURLOPT_TIMEOUT, settings.transfer_timeout);
    if (settings.stall_timeout > 0) {
        set(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
        set(easy, CURLOPT_LOW_SPEED_TIME, settings.stall_timeout);
    }
    set(easy, CURLOPT_USERAGENT, "sqbox");
    set(easy, CURLOPT_ERRORBUFFER, transfer.curl_error);
    set(easy, CURLOPT_HEADERFUNCTION, &on_header);
    set(easy, CURLOPT_HEADERDATA, static_cast<void*>(&transfer));
    set(easy, CURLOPT_WRITEFUNCTION, &on_body);
    set(easy, CURLOPT_WRITEDATA, static_cast<void*>(&transfer));
    set(easy, CURLOPT_PRIVATE, static_cast<void*>(&transfer));
    if (request.head) set(easy, CURLOPT_NOBODY, 1L);
    if (!request.unix_socket.empty()) {
        set(easy, CURLOPT_UNIX_SOCKET_PATH, request.unix_socket.c_str());
        set(easy, CURLOPT_NOPROXY, "*");
    }
}

struct MultiDeleter {
    void operator()(CURLM* multi) const { (void)curl_library().multi_cleanup(multi); }
};

// The multi handle with the transfers in it; removes them all when it goes, on errors too.
class Multi {
  public:
    Multi() : multi_(curl_library().multi_init()) {
        if (!multi_) throw Error("cannot create a libcurl multi handle");
    }
    Multi(const Multi&) = delete;
    Multi& operator=(const Multi&) = delete;
    ~Multi() {
        // Removal cannot fail for a handle that is in; nothing to do if it did.
        for (CURL* easy : active_) (void)curl_library().multi_remove_handle(multi_.get(), easy);
    }
    void add(Transfer& transfer) {
        const CURLMcode code = curl_library().multi_add_handle(multi_.get(), transfer.easy.get());
        if (code != CURLM_OK) {
            throw Error(std::string("libcurl: ") + curl_library().multi_strerror(code));
        }
        active_.push_back(transfer.easy.get());
    }
    void remove(CURL* easy) {
        (void)curl_library().multi_remove_handle(multi_.get(), easy);  // it is in: cannot fail
        active_.erase(std::remove(active_.begin(), active_.end(), easy), active_.end());
    }
    [[nodiscard]] size_t active() const { return active_.size(); }
    [[nodiscard]] CURLM* get() const { return multi_.get(); }

  private:
    std::unique_ptr<CURLM, MultiDeleter> multi_;
    std::vector<CURL*> active_;
};

std::string describe_failure(const Transfer& transfer, CURLcode code) {
    if (!transfer.failure.empty()) return transfer.request->what + " " + transfer.failure;
    std::string detail =
        transfer.curl_error[0] != '\0' ? transfer.curl_error : curl_library().easy_strerror(code);
    if (code == CURLE_PARTIAL_FILE) {
        detail = "the connection closed early (" + std::to_string(transfer.response.body_size) +
                 " bytes received): " + detail;
    }
    return "cannot fetch " + transfer.request->what + " from " + transfer.url + ": " + detail;
}

}  // namespace

std::string url_origin(const std::string& url) {
    CurlUrl handle = parse_url(url);
    return url_part(handle, CURLUPART_SCHEME) + "://" + url_part(handle, CURLUPART_HOST) + ":" +
           url_part(handle, CURLUPART_PORT, CURLU_DEFAULT_PORT);
}

std::string url_with_query(const std::string& url,
                           const std::vector<std::pair<std::string, std::string>>& parameters) {
    CurlUrl handle = parse_url(url);
    for (const auto& [name, value] : parameters) {
        const std::string pair = name + "=" + value;
        if (curl_library().url_set(handle.get(), CURLUPART_QUERY, pair.c_str(),
                                   CURLU_APPENDQUERY | CURLU_URLENCODE) != CURLUE_OK) {
            throw Error("cannot add a query parameter to " + url);
        }
    }
    return url_part(handle, CURLUPART_URL);
}

std::vector<HttpResponse> perform_requests(const std::vector<HttpRequest>& requests,
                                           const HttpSettings& settings) {
    std::vector<std::unique_ptr<Transfer>> transfers;
    std::deque<Transfer*> waiting;
    for (size_t i = 0; i < requests.size(); ++i) {
        auto transfer = std::make_unique<Transfer>();
        transfer->request = &requests[i];
        transfer->index = i;
        transfer->url = requests[i].url;
        transfer->settings = &settings;
        waiting.push_back(transfer.get());
        transfers.push_back(std::move(transfer));
    }
    std::vector<HttpResponse> responses(requests.size());
    Multi multi;
    const size_t limit = settings.max_connections > 0
                             ? static_cast<size_t>(settings.max_connections)
                             : requests.size();
    size_t finished = 0;
    while (finished < requests.size()) {
        // Start what may start: within the connection limit and past any retry delay.
        const auto now = Clock::now();
        for (auto it = waiting.begin(); it != waiting.end() && multi.active() < limit;) {
            if ((*it)->not_before > now) {
                ++it;
                continue;
            }
            start_attempt(**it);
            multi.add(**it);
            it = waiting.erase(it);
        }
        int running = 0;
        CURLMcode code = curl_library().multi_perform(multi.get(), &running);
        if (code != CURLM_OK) {
            throw Error(std::string("libcurl: ") + curl_library().multi_strerror(code));
        }
        int left = 0;
        while (CURLMsg* message = curl_library().multi_info_read(multi.get(), &left)) {
            if (message->msg != CURLMSG_DONE) continue;
            void* pointer = nullptr;
            (void)curl_library().easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, &pointer);
            Transfer& transfer = *static_cast<Transfer*>(pointer);
            const CURLcode result = message->data.result;
            multi.remove(transfer.easy.get());
            transfer.response.status = current_status(transfer);
            transfer.response.url = transfer.url;
            const bool retry_left = transfer.attempt < settings.retries;
            if (result != CURLE_OK) {
                if (transfer.failure.empty() && transient(result) && retry_left) {
                    ++transfer.attempt;
                    transfer.not_before = Clock::now() + std::chrono::seconds(transfer.attempt);
                    waiting.push_back(&transfer);
                    continue;
                }
                throw Error(describe_failure(transfer, result));
            }
            const long status = transfer.response.status;
            if (status >= 300 && status < 400 && transfer.response.headers.contains("location")) {
                if (++transfer.redirects > settings.max_redirects) {
                    throw Error("too many redirects (more than " +
                                std::to_string(settings.max_redirects) + ") fetching " +
                                transfer.request->what + ", last to " + transfer.url);
                }
                transfer.url =
                    resolve_location(transfer.url, transfer.response.headers["location"]);
                waiting.push_front(&transfer);
                continue;
            }
            if (transient_status(status) && retry_left) {
                ++transfer.attempt;
                transfer.not_before = Clock::now() + std::chrono::seconds(transfer.attempt);
                waiting.push_back(&transfer);
                continue;
            }
            if (transfer.success_body() && transfer.request->body_fd >= 0) {
                transfer.response.body_digest = transfer.hash->digest();
            }
            responses[transfer.index] = std::move(transfer.response);
            transfer.easy.reset();
            transfer.headers.reset();
            ++finished;
        }
        if (finished == requests.size()) break;
        int timeout_ms = 1000;
        if (multi.active() == 0 && !waiting.empty()) {
            // Only retries waiting for their time: sleep until the first is due.
            auto due = waiting.front()->not_before;
            for (const Transfer* transfer : waiting) due = std::min(due, transfer->not_before);
            const auto delay =
                std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now());
            if (delay.count() > 0) std::this_thread::sleep_for(delay);
            continue;
        }
        code = curl_library().multi_poll(multi.get(), nullptr, 0, timeout_ms, nullptr);
        if (code != CURLM_OK) {
            throw Error(std::string("libcurl: ") + curl_library().multi_strerror(code));
        }
    }
    return responses;
}

}  // namespace sqbox

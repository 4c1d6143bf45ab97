#include "import/curl_library.h"

#include <dlfcn.h>

#include <string>

#include "util/errors.h"

namespace sqbox {
namespace {

template <typename Function>
void resolve(void* handle, const char* name, Function& function) {
    void* symbol = ::dlsym(handle, name);
    if (symbol == nullptr) throw Error(std::string("libcurl lacks ") + name + " (too old?)");
    function = reinterpret_cast<Function>(symbol);
}

CurlLibrary load() {
    void* handle = nullptr;
    // Any flavour will do: the OpenSSL one first (Debian's libcurl4), then GnuTLS.
    for (const char* name : {"libcurl.so.4", "libcurl-gnutls.so.4"}) {
        handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (handle != nullptr) break;
    }
    if (handle == nullptr) {
        throw Error(
            "imports from registries and engines need libcurl, which is not installed (Debian: "
            "libcurl4)");
    }
    // The library stays loaded for the life of the process: no dlclose.
    CurlLibrary library{};
    resolve(handle, "curl_easy_init", library.easy_init);
    resolve(handle, "curl_easy_setopt", library.easy_setopt);
    resolve(handle, "curl_easy_getinfo", library.easy_getinfo);
    resolve(handle, "curl_easy_cleanup", library.easy_cleanup);
    resolve(handle, "curl_easy_perform", library.easy_perform);
    resolve(handle, "curl_easy_strerror", library.easy_strerror);
    resolve(handle, "curl_slist_append", library.slist_append);
    resolve(handle, "curl_slist_free_all", library.slist_free_all);
    resolve(handle, "curl_multi_init", library.multi_init);
    resolve(handle, "curl_multi_add_handle", library.multi_add_handle);
    resolve(handle, "curl_multi_remove_handle", library.multi_remove_handle);
    resolve(handle, "curl_multi_perform", library.multi_perform);
    resolve(handle, "curl_multi_poll", library.multi_poll);
    resolve(handle, "curl_multi_info_read", library.multi_info_read);
    resolve(handle, "curl_multi_cleanup", library.multi_cleanup);
    resolve(handle, "curl_multi_strerror", library.multi_strerror);
    resolve(handle, "curl_url", library.url);
    resolve(handle, "curl_url_set", library.url_set);
    resolve(handle, "curl_url_get", library.url_get);
    resolve(handle, "curl_url_cleanup", library.url_cleanup);
    resolve(handle, "curl_free", library.free);
    CURLcode (*global_init)(long) = nullptr;
    resolve(handle, "curl_global_init", global_init);
    if (global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("cannot initialise libcurl");
    return library;
}

}  // namespace

const CurlLibrary& curl_library() {
    // A function-local static, not std::call_once: load() throws when libcurl is missing, and an
    // exception must not unwind through glibc's pthread_once, whose cleanup handler is run by
    // libgcc_s's personality routine while the unwinder is the static libgcc's (the packaged
    // binary links libgcc statically): that aborts. A throwing initialiser is tried again next
    // call.
    static const CurlLibrary library = load();
    return library;
}

}  // namespace sqbox

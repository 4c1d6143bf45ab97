// libcurl, loaded when an import first needs it rather than linked: every shared library the
// binary links costs each `sqbox run` its loading, and libcurl brings some thirty (ldd). Only the
// types come from <curl/curl.h>; the functions are called through this table.
#pragma once

#include <curl/curl.h>

namespace sqbox {

struct CurlLibrary {
    CURL* (*easy_init)();
    CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
    CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
    void (*easy_cleanup)(CURL*);
    CURLcode (*easy_perform)(CURL*);
    const char* (*easy_strerror)(CURLcode);
    curl_slist* (*slist_append)(curl_slist*, const char*);
    void (*slist_free_all)(curl_slist*);
    CURLM* (*multi_init)();
    CURLMcode (*multi_add_handle)(CURLM*, CURL*);
    CURLMcode (*multi_remove_handle)(CURLM*, CURL*);
    CURLMcode (*multi_perform)(CURLM*, int*);
    CURLMcode (*multi_poll)(CURLM*, curl_waitfd*, unsigned int, int, int*);
    CURLMsg* (*multi_info_read)(CURLM*, int*);
    CURLMcode (*multi_cleanup)(CURLM*);
    const char* (*multi_strerror)(CURLMcode);
    CURLU* (*url)();
    CURLUcode (*url_set)(CURLU*, CURLUPart, const char*, unsigned int);
    CURLUcode (*url_get)(const CURLU*, CURLUPart, char**, unsigned int);
    void (*url_cleanup)(CURLU*);
    void (*free)(void*);
};

// The loaded and initialised library (once per process). Throws Error naming the Debian package
// when libcurl is not installed.
const CurlLibrary& curl_library();

}  // namespace sqbox

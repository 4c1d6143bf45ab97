// The caller's own directories, found as the XDG base-directory rules say: a variable if it is
// set, else a place under the home directory.
#pragma once

#include <string>

namespace sqbox {

// The variable `name`, or `fallback` when it is unset or empty.
std::string environment_or(const char* name, const std::string& fallback);

// $HOME, else the caller's passwd entry. Throws Error when neither gives one; `hint` is appended
// to the message (which variable would do instead).
std::string home_directory(const std::string& hint);

// Where sqbox keeps per-user caches: $SQBOX_CACHE_DIR, else $XDG_CACHE_HOME/sqbox, else
// ~/.cache/sqbox. Relative values are ignored (the XDG rule); "" when there is no home either.
std::string sqbox_cache_directory();

}  // namespace sqbox

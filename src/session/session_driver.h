// The session driver (src/session/driver.py), built into the binary: `sqbox serve` writes it into
// its supervisor's scratch root and binds it read-only into every session's sandbox.
#pragma once

#include <string_view>

namespace sqbox {

std::string_view session_driver_source();

}  // namespace sqbox

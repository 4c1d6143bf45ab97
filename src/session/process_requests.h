// Background processes of a session (PROTOCOL.md, "Background processes"): commands the
// session's driver starts beside the interpreter, in the same sandbox, whose output is read
// later and which end with the session's sandbox. The driver keeps them; the server checks
// the requests and passes them on in the session's order.
#pragma once

#include <string>

#include "session/protocol_lines.h"

namespace sqbox {

// process_start, process_read, process_wait, process_kill.
bool is_process_op(const std::string& op);

// The request as the driver gets it (without id, session or seq): its fields checked for their
// types; throws Error or json::exception for a malformed one.
json process_request_for_driver(const json& request);

}  // namespace sqbox

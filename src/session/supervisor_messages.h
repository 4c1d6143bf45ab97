// The server's reading of what its warm supervisor (warm_supervisor.h) sends it. The supervisor
// is sqbox's own, but a message that does not say what it should (a bug, a crash halfway) must
// stop the server with a clear line rather than end it in an uncaught exception.
#pragma once

#include <string>

#include "session/protocol_lines.h"
#include "util/fd_passing.h"

namespace sqbox {

// The message's text as JSON: an object; a 'r' report has an unsigned integer "key" and the
// report's fields with their types (exit_status and wait_status integers, payload_started,
// payload_finished and timed_out booleans, wall_ns, cpu_ns and max_rss_kib integers, error a
// string), each optional but the key; an 'e' failure's "error", if any, is a string. Anything
// else throws Error naming what is wrong.
json parse_supervisor_message(MessageTag tag, const std::string& text);

}  // namespace sqbox

// Streamed output (PROTOCOL.md, "Streaming output"): while a `run` or an `exec` with
// `"stream": true` is under way, what its command writes reaches the client as `output` events,
// before the final answer, which still carries all of it.
//
// Back-pressure: a client that reads its events slowly must not make the server hold a flood.
// The server stops reading a streaming sandbox's output (for a session, its driver's channel)
// while more than kClientBacklogBytes of answers wait for that client; the payload then blocks
// on its full pipe. What is streamed is what is kept: the output limit caps both.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "session/protocol_lines.h"

namespace sqbox {

// Unsent answers of one client beyond which the server reads no more streamed output for it.
inline constexpr size_t kClientBacklogBytes = size_t{1} * 1024 * 1024;

// The length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence that
// more bytes could still complete: a text event never splits a character. Bytes that cannot
// start or continue a character count as complete (they are replaced when sent).
size_t complete_utf8_prefix(std::string_view bytes);

// One output event for the client. `binary`: the bytes as `data_b64`, else as `data` (UTF-8,
// invalid bytes replaced when the line is written).
json output_event(const json& id, std::string_view stream, std::string_view bytes, bool binary);

// What of a captured stream has gone out as events, for a sandbox whose output the server reads
// itself (a `run`): the bytes kept since the last call, cut at a character boundary unless the
// stream has ended.
class StreamedCapture {
  public:
    // The part of `kept` (all that is kept of the stream so far) not yet sent; `ended`: no more
    // will come, so an unfinished character goes out too (replaced).
    std::string_view next(const std::string& kept, bool binary, bool ended);

  private:
    size_t sent_ = 0;
};

}  // namespace sqbox

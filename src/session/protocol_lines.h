// The line format of the serve protocol (PROTOCOL.md), shared by the clients' side and the
// session drivers' side: one JSON object per line, each line of bounded size and depth.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sqbox {

// Ordered: objects keep their keys' order (a tool's kwargs, a result dict) on their way through.
using json = nlohmann::ordered_json;

// A put of 64 MiB is about 86 MiB of base64; anything longer is not a request.
inline constexpr size_t kMaxRequestBytes = size_t{96} * 1024 * 1024;

// One message as a line. Answers can carry 16 MiB of output: built in place, never copied.
std::string dump_line(const json& message);

// Parses one protocol line; throws Error for anything that is not a JSON object of bounded depth.
json parse_message(const std::string& line);

// The "error" member of a failed answer.
json error_object(const std::string& type, const std::string& message);

// Bytes as they arrive, cut into lines. Lines are taken by offset and the buffer shifted once by
// compact(): erasing each line from the front would move the rest of the buffer once per line.
class LineBuffer {
  public:
    void append(std::string_view bytes) { data_.append(bytes); }
    // The next complete line, without its newline; false when only an unfinished one is left.
    bool next_line(std::string& line);
    // Drops the lines taken; returns the size of the unfinished line that remains.
    size_t compact();
    void clear();

  private:
    std::string data_;
    size_t consumed_ = 0;  // bytes of data_ taken as lines since the last compact()
    size_t scanned_ = 0;   // bytes of data_ known to hold no newline (long lines come in pieces)
};

}  // namespace sqbox

#include "session/protocol_lines.h"

#include <algorithm>

#include "util/errors.h"

namespace sqbox {
namespace {

// Deeper JSON is refused while parsing: copying or printing it would recurse off the stack.
constexpr int kMaxJsonDepth = 64;

}  // namespace

std::string dump_line(const json& message) {
    std::string line = message.dump(-1, ' ', false, json::error_handler_t::replace);
    line += '\n';
    return line;
}

json parse_message(const std::string& line) {
    json message;
    try {
        message = json::parse(line, [](int depth, json::parse_event_t /*event*/, json& /*value*/) {
            if (depth > kMaxJsonDepth) throw Error("JSON nested too deeply");
            return true;
        });
    } catch (const json::exception& e) {
        throw Error(std::string("not JSON: ") + e.what());
    }
    if (!message.is_object()) throw Error("a message is a JSON object");
    return message;
}

json error_object(const std::string& type, const std::string& message) {
    return {{"type", type}, {"message", message}};
}

bool LineBuffer::next_line(std::string& line) {
    const size_t newline = data_.find('\n', std::max(consumed_, scanned_));
    if (newline == std::string::npos) return false;
    line = data_.substr(consumed_, newline - consumed_);
    consumed_ = newline + 1;
    return true;
}

size_t LineBuffer::compact() {
    data_.erase(0, consumed_);
    consumed_ = 0;
    scanned_ = data_.size();
    return data_.size();
}

void LineBuffer::clear() {
    data_.clear();
    consumed_ = 0;
    scanned_ = 0;
}

}  // namespace sqbox

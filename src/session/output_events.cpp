#include "session/output_events.h"

#include "session/request_config.h"

namespace sqbox {

size_t complete_utf8_prefix(std::string_view bytes) {
    // A character is at most 4 bytes: only the last 3 can belong to an unfinished one.
    const size_t size = bytes.size();
    for (size_t back = 1; back <= 3 && back <= size; ++back) {
        const auto byte = static_cast<unsigned char>(bytes[size - back]);
        if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        size_t length = 1;
        if ((byte & 0xE0) == 0xC0) {
            length = 2;
        } else if ((byte & 0xF0) == 0xE0) {
            length = 3;
        } else if ((byte & 0xF8) == 0xF0) {
            length = 4;
        }
        // The sequence starting here still lacks bytes: hold it back.
        return length > back ? size - back : size;
    }
    return size;
}

json output_event(const json& id, std::string_view stream, std::string_view bytes, bool binary) {
    json event = {{"id", id}, {"event", "output"}, {"stream", stream}};
    if (binary) {
        event["data_b64"] = base64_encode(bytes);
    } else {
        event["data"] = std::string(bytes);
    }
    return event;
}

std::string_view StreamedCapture::next(const std::string& kept, bool binary, bool ended) {
    if (sent_ >= kept.size()) return {};
    std::string_view fresh = std::string_view(kept).substr(sent_);
    if (!binary && !ended) fresh = fresh.substr(0, complete_utf8_prefix(fresh));
    sent_ += fresh.size();
    return fresh;
}

}  // namespace sqbox

#include "session/supervisor_messages.h"

#include <initializer_list>
#include <utility>

#include "util/errors.h"

namespace sqbox {
namespace {

enum class Kind { kInteger, kBoolean, kString };

void check_field(const json& body, const char* name, Kind kind) {
    const auto field = body.find(name);
    if (field == body.end()) return;
    const bool right = kind == Kind::kInteger   ? field->is_number_integer()
                       : kind == Kind::kBoolean ? field->is_boolean()
                                                : field->is_string();
    if (!right) throw Error(std::string("the field '") + name + "' has the wrong type");
}

}  // namespace

json parse_supervisor_message(MessageTag tag, const std::string& text) {
    json body = parse_message(text);
    if (tag == MessageTag::kReport) {
        const auto key = body.find("key");
        if (key == body.end() || !key->is_number_unsigned()) {
            throw Error("a report without a sandbox's key");
        }
        for (const auto& [name, kind] : std::initializer_list<std::pair<const char*, Kind>>{
                 {"exit_status", Kind::kInteger},
                 {"wait_status", Kind::kInteger},
                 {"payload_started", Kind::kBoolean},
                 {"payload_finished", Kind::kBoolean},
                 {"timed_out", Kind::kBoolean},
                 {"wall_ns", Kind::kInteger},
                 {"cpu_ns", Kind::kInteger},
                 {"max_rss_kib", Kind::kInteger},
                 {"error", Kind::kString}}) {
            check_field(body, name, kind);
        }
    } else if (tag == MessageTag::kFailed) {
        check_field(body, "error", Kind::kString);
    }
    return body;
}

}  // namespace sqbox

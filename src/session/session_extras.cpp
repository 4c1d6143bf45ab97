#include "session/session_extras.h"

#include <vector>

namespace sqbox {
namespace {

// A non-negative integer field (get<uint64_t>() would take -1 for 2^64-1).
uint64_t count_field(const json& request, const char* name, uint64_t absent) {
    const auto it = request.find(name);
    if (it == request.end()) return absent;
    if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
        throw Error(std::string(name) + ": expected a non-negative integer");
    }
    return it->get<uint64_t>();
}

std::string string_field(const json& request, const char* name) {
    const auto it = request.find(name);
    if (it == request.end() || !it->is_string()) {
        throw Error(request.value("op", "") + ": '" + name + "' must be a string");
    }
    return it->get<std::string>();
}

std::string too_large(const std::string& what, uint64_t budget) {
    return what + " would pass the sandbox's writable budget of " + std::to_string(budget) +
           " bytes";
}

}  // namespace

bool is_session_extra_op(std::string_view op) {
    return op == "upload" || op == "download" || op == "shell" || op == "shell_close";
}

uint64_t base64_decoded_size(std::string_view text) {
    uint64_t padding = 0;
    while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') {
        ++padding;
    }
    const uint64_t size = text.size() / 4 * 3 + text.size() % 4 * 3 / 4;
    return size > padding ? size - padding : 0;
}

json session_extra_request(const json& request, uint64_t budget, uint64_t output_limit,
                           std::optional<double>& timeout) {
    const std::string op = request.at("op").get<std::string>();
    json to_driver = {{"op", op}};
    if (op == "upload" || op == "download") {
        const uint64_t offset = count_field(request, "offset", 0);
        to_driver["offset"] = offset;
        if (offset == 0) to_driver["path"] = string_field(request, "path");
        if (op == "upload") {
            const std::string data = string_field(request, "data_b64");
            if (offset > budget || base64_decoded_size(data) > budget - offset) {
                throw TransferTooLarge(too_large("the upload", budget));
            }
            to_driver["data_b64"] = data;  // a chunk: a few MiB
            const auto last = request.find("last");
            if (last != request.end() && !last->is_boolean()) throw Error("last: expected a bool");
            to_driver["last"] = last != request.end() && last->get<bool>();
        } else {
            if (offset > budget) throw TransferTooLarge(too_large("the download", budget));
            to_driver["limit"] = budget;
        }
    } else if (op == "shell" || op == "shell_close") {
        if (request.contains("name")) to_driver["name"] = string_field(request, "name");
        if (op == "shell") {
            to_driver["command"] = string_field(request, "command");
            to_driver["output_limit"] = count_field(request, "output_limit", output_limit);
            if (request.contains("program")) {
                to_driver["program"] = request.at("program").get<std::vector<std::string>>();
            }
            if (request.contains("timeout") && !request.at("timeout").is_null()) {
                const double seconds = request.at("timeout").get<double>();
                if (!(seconds > 0) || seconds > 7 * 24 * 3600) {
                    throw Error("timeout: expected a positive number of seconds (at most a week)");
                }
                to_driver["timeout"] = seconds;
                timeout = seconds;
            }
        }
    }
    return to_driver;
}

bool download_answer_within_budget(const json& answer, uint64_t offset, uint64_t budget) {
    const auto data = answer.find("data_b64");
    if (data == answer.end() || !data->is_string()) return false;
    const uint64_t size = base64_decoded_size(data->get_ref<const std::string&>());
    return offset <= budget && size <= budget - offset;
}

}  // namespace sqbox

#include "warm_up/warm_up_list.h"

#include <unordered_map>

namespace sqbox {
namespace {

constexpr std::string_view kHeader = "sqbox-warm-up 1\n";

bool valid_path(std::string_view path) {
    if (path == "/") return true;
    if (path.size() < 2 || path.size() > kMaxWarmUpPathBytes || path.front() != '/') return false;
    size_t start = 1;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string_view::npos) end = path.size();
        const std::string_view part = path.substr(start, end - start);
        if (part.empty() || part == "." || part == "..") return false;
        start = end + 1;
    }
    return true;
}

struct DecodedRecords {
    std::vector<WarmUpName> names;
    bool complete = true;  // the data ended on a record boundary
};

DecodedRecords decode_records(std::string_view data) {
    DecodedRecords decoded;
    std::vector<WarmUpName>& names = decoded.names;
    while (!data.empty()) {
        const size_t end = data.find('\0');
        if (end == std::string_view::npos) {
            decoded.complete = false;
            break;
        }
        const auto kind = static_cast<WarmUpKind>(data.front());
        const std::string_view path = end == 0 ? std::string_view() : data.substr(1, end - 1);
        if ((kind == WarmUpKind::kLookUp || kind == WarmUpKind::kRead ||
             kind == WarmUpKind::kList) &&
            valid_path(path)) {
            names.push_back({std::string(path), kind});
        }
        data.remove_prefix(end + 1);
    }
    return decoded;
}

}  // namespace

std::string encode_warm_up_record(const WarmUpName& name) {
    std::string record;
    record.reserve(name.path.size() + 2);
    record += static_cast<char>(name.kind);
    record += name.path;
    record += '\0';
    return record;
}

std::vector<WarmUpName> decode_warm_up_records(std::string_view data) {
    return decode_records(data).names;
}

std::string encode_warm_up_list(const std::vector<WarmUpName>& names) {
    std::string data(kHeader);
    for (const auto& name : names) data += encode_warm_up_record(name);
    return data;
}

std::optional<std::vector<WarmUpName>> decode_warm_up_list(std::string_view data) {
    if (!data.starts_with(kHeader)) return std::nullopt;
    DecodedRecords decoded = decode_records(data.substr(kHeader.size()));
    if (!decoded.complete) return std::nullopt;
    return merge_warm_up_names({}, decoded.names);
}

std::vector<WarmUpName> merge_warm_up_names(std::vector<WarmUpName> known,
                                            const std::vector<WarmUpName>& learned) {
    if (known.size() > kMaxWarmUpNames) known.resize(kMaxWarmUpNames);
    std::unordered_map<std::string, size_t> position;
    for (size_t i = 0; i < known.size(); ++i) position.try_emplace(known[i].path, i);
    for (const auto& name : learned) {
        auto found = position.find(name.path);
        if (found != position.end()) {
            WarmUpKind& kind = known[found->second].kind;
            if (kind == WarmUpKind::kLookUp) kind = name.kind;
        } else if (known.size() < kMaxWarmUpNames) {
            position.emplace(name.path, known.size());
            known.push_back(name);
        }
    }
    return known;
}

}  // namespace sqbox

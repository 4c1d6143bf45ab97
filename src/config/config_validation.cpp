#include "config/config_validation.h"

#include <filesystem>

#include "util/errors.h"
#include "util/sizes.h"
#include "util/variable_names.h"

namespace sqbox::validate {
namespace {

constexpr const char* kUnlimited = "unlimited";
constexpr size_t kMaxHostnameLength = 64;

std::optional<uint64_t> size_or_unlimited(const std::string& text, const std::string& option) {
    if (text == kUnlimited) return std::nullopt;
    return parse_size(text, option);
}

std::optional<uint64_t> count_or_unlimited(const std::string& text, const std::string& option) {
    if (text == kUnlimited) return std::nullopt;
    return parse_count(text, option);
}

}  // namespace

std::string sandbox_path(const std::string& path, const std::string& context) {
    if (path.empty() || path.front() != '/') {
        throw Error(context + ": " + (path.empty() ? "empty path" : path) +
                    " must be an absolute path inside the sandbox");
    }
    std::string normalised;
    size_t start = 0;
    while (start <= path.size()) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        const std::string_view part = std::string_view(path).substr(start, slash - start);
        if (part == "..") throw Error(context + ": path " + path + " must not contain '..'");
        if (!part.empty() && part != ".") normalised.append("/").append(part);
        start = slash + 1;
    }
    return normalised.empty() ? "/" : normalised;
}

std::string mount_destination(const std::string& path, const std::string& context) {
    std::string destination = sandbox_path(path, context);
    if (destination == "/") throw Error(context + ": cannot mount over the sandbox's root");
    return destination;
}

std::string working_directory(const std::string& path, const std::string& context) {
    return sandbox_path(path, context);
}

std::string host_path(const std::string& path, const std::string& context) {
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::canonical(path, ec);
    if (ec) throw Error(context + ": " + path + ": " + ec.message());
    return canonical.string();
}

std::string host_mount_source(const std::string& path, const std::string& context) {
    if (path.empty()) throw Error(context + ": empty source path");
    return host_path(path, context);
}

MountSpec host_bind_mount(const std::string& source, const std::string& destination, bool read_only,
                          const std::string& context) {
    MountSpec mount;
    mount.kind = MountSpec::Kind::kBind;
    mount.source_in = MountSpec::SourceIn::kHost;
    mount.source = host_mount_source(source, context);
    mount.destination = mount_destination(destination, context);
    mount.read_only = read_only;
    return mount;
}

std::optional<uint64_t> memory_limit(const std::string& text, const std::string& option) {
    return size_or_unlimited(text, option);
}

std::optional<uint64_t> process_limit(const std::string& text, const std::string& option) {
    return count_or_unlimited(text, option);
}

std::optional<uint64_t> file_size_limit(const std::string& text, const std::string& option) {
    return size_or_unlimited(text, option);
}

std::optional<uint64_t> open_files_limit(const std::string& text, const std::string& option) {
    return count_or_unlimited(text, option);
}

uint64_t cpu_time_limit(const std::string& text, const std::string& option) {
    return parse_count(text, option);
}

double cpu_share(const std::string& text, const std::string& option) {
    return parse_cpus(text, option);
}

uint64_t tmpfs_size(const std::string& text, const std::string& option) {
    return parse_size(text, option);
}

uint64_t output_limit(const std::string& text, const std::string& option) {
    return parse_size(text, option, true);
}

std::optional<uint64_t> output_limit_or_unlimited(const std::string& text,
                                                  const std::string& option) {
    if (text == kUnlimited) return std::nullopt;
    return output_limit(text, option);
}

double timeout_seconds(const std::string& text, const std::string& option) {
    return parse_seconds(text, option);
}

unsigned image_server_idle_seconds(const std::string& text, const std::string& option) {
    constexpr uint64_t kDay = uint64_t{24} * 60 * 60;
    // 0 is allowed (the sandbox serves its image itself), so not parse_count's "positive".
    const bool digits_only = !text.empty() && text.size() <= 5 &&
                             text.find_first_not_of("0123456789") == std::string::npos;
    if (!digits_only || std::stoull(text) > kDay) {
        throw Error("invalid value '" + text + "' for " + option +
                    ": expected a whole number of seconds from 0 (the sandbox serves its image "
                    "itself) to 86400 (a day)");
    }
    return static_cast<unsigned>(std::stoull(text));
}

std::string hostname(const std::string& text, const std::string& context) {
    if (text.empty() || text.size() > kMaxHostnameLength) {
        throw Error(context + ": must be 1 to " + std::to_string(kMaxHostnameLength) +
                    " characters");
    }
    return text;
}

void check_variable_name(const std::string& name, const std::string& context) {
    if (!is_valid_variable_name(name)) {
        throw Error(context + ": invalid variable name '" + name + "'");
    }
}

std::pair<std::string, std::optional<std::string>> variable_assignment(const std::string& text,
                                                                       const std::string& context) {
    const size_t equals = text.find('=');
    std::string name = text.substr(0, equals);
    check_variable_name(name, context);
    if (equals == std::string::npos) return {std::move(name), std::nullopt};
    return {std::move(name), text.substr(equals + 1)};
}

std::string seccomp_profile(const std::string& text, const std::string& context) {
    if (text.empty()) throw Error(context + ": empty profile name");
    return text;
}

}  // namespace sqbox::validate

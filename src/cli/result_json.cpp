#include "cli/result_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox::cli {

namespace {

// Whole numbers as JSON integers (4294967296, not 4294967296.0).
nlohmann::json json_number(const std::optional<double>& value) {
    if (!value) return nullptr;
    if (std::floor(*value) == *value && *value >= 0 && *value < 1.8e19) {
        return static_cast<uint64_t>(*value);
    }
    return *value;
}

}  // namespace

std::string result_to_json(const RunResult& result) {
    nlohmann::json record;
    record["exit_code"] = result.exit_status;
    record["payload_exit_code"] =
        result.payload_exit_code ? nlohmann::json(*result.payload_exit_code) : nlohmann::json();
    record["signal"] = result.signal ? nlohmann::json(*result.signal) : nlohmann::json();
    record["timed_out"] = result.timed_out;
    record["started"] = result.payload_started;
    record["wall_ms"] = result.wall_ms;
    record["cpu_ms"] = result.cpu_ms;
    record["peak_rss_bytes"] = result.peak_rss_bytes;
    record["oom_killed"] = result.oom_killed;
    record["stdout_truncated"] = result.stdout_truncated;
    record["stderr_truncated"] = result.stderr_truncated;
    record["truncated"] = result.stdout_truncated || result.stderr_truncated;
    nlohmann::json limits = nlohmann::json::object();
    for (const auto& limit : result.limits) {
        limits[limit.name] = {{"value", json_number(limit.value)},
                              {"enforced_by", limit.enforced_by}};
    }
    record["limits"] = limits;
    record["seccomp"] = result.seccomp;
    record["landlock_abi"] = result.landlock_abi;
    auto text_or_null = [](const std::string& text) {
        return text.empty() ? nlohmann::json() : nlohmann::json(text);
    };
    record["image_access"] = text_or_null(result.image_access);
    record["proc"] = text_or_null(result.proc);
    record["error"] = result.error.empty() ? nlohmann::json() : nlohmann::json(result.error);
    return record.dump() + "\n";
}

JsonResultFile::JsonResultFile(const std::string& path) : path_(path) {
    fd_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) throw system_error("--json " + path);
}

bool JsonResultFile::write(const RunResult& result) {
    std::string text = result_to_json(result);
    return write_all(fd_.get(), text.data(), text.size()) && ::fsync(fd_.get()) == 0;
}

}  // namespace sqbox::cli

#include "runtime/limits.h"

#include <sys/resource.h>

#include <string>

#include "util/errors.h"

namespace sqbox {
namespace {

void set_limit(int resource, rlim_t soft, rlim_t hard, const char* option) {
    rlimit limit{soft, hard};
    if (::setrlimit(resource, &limit) != 0) {
        throw system_error(std::string("cannot apply ") + option + " limit");
    }
}

void set_optional(int resource, const std::optional<uint64_t>& value, const char* option) {
    if (value) set_limit(resource, *value, *value, option);
}

}  // namespace

void apply_resource_limits(const ResourceLimits& limits) {
    set_limit(RLIMIT_CORE, 0, 0, "core dump");
    set_optional(RLIMIT_AS, limits.memory_bytes, "--memory");
    set_optional(RLIMIT_NPROC, limits.processes, "--pids");
    set_optional(RLIMIT_FSIZE, limits.file_size_bytes, "--fsize");
    set_optional(RLIMIT_NOFILE, limits.open_files, "--nofile");
    if (limits.cpu_seconds) {
        set_limit(RLIMIT_CPU, *limits.cpu_seconds, *limits.cpu_seconds + 1, "--cpu-time");
    }
}

}  // namespace sqbox

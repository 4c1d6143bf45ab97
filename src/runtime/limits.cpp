#include "runtime/limits.h"

#include <sys/resource.h>

#include <algorithm>
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

// --memory without a cgroup bounds each process. What a process allocates for itself (heap,
// private writable mappings, stacks) is RLIMIT_DATA; the address space is bounded too (it also
// counts shared mappings), but looser: capping it at the memory limit would also cap mappings
// that cost nothing (a sparse file mapped whole, PROT_NONE reservations of allocators and
// runtimes, which CPython's own tests make).
constexpr uint64_t kAddressSpacePerMemory = 4;

// Sets `resource` to `value`, or to the hard limit the caller already has if that is lower (a
// limit derived from --memory may exceed what the caller may raise it to).
void set_at_most(int resource, uint64_t value, const char* option) {
    rlimit current{};
    if (::getrlimit(resource, &current) != 0) {
        throw system_error(std::string("cannot read the current ") + option + " limit");
    }
    const rlim_t limit = std::min<rlim_t>(value, current.rlim_max);
    set_limit(resource, limit, limit, option);
}

void limit_memory(const std::optional<uint64_t>& memory_bytes) {
    if (!memory_bytes) return;
    set_at_most(RLIMIT_DATA, *memory_bytes, "--memory");
    const uint64_t address_space = *memory_bytes > RLIM_INFINITY / kAddressSpacePerMemory
                                       ? RLIM_INFINITY
                                       : *memory_bytes * kAddressSpacePerMemory;
    set_at_most(RLIMIT_AS, address_space, "--memory");
}

}  // namespace

void apply_resource_limits(const ResourceLimits& limits) {
    set_limit(RLIMIT_CORE, 0, 0, "core dump");
    limit_memory(limits.memory_bytes);
    set_optional(RLIMIT_NPROC, limits.processes, "--pids");
    set_optional(RLIMIT_FSIZE, limits.file_size_bytes, "--fsize");
    set_optional(RLIMIT_NOFILE, limits.open_files, "--nofile");
    if (limits.cpu_seconds) {
        set_limit(RLIMIT_CPU, *limits.cpu_seconds, *limits.cpu_seconds + 1, "--cpu-time");
    }
}

}  // namespace sqbox

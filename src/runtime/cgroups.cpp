#include "runtime/cgroups.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr const char* kNamePrefix = "sqbox-";
constexpr uint64_t kCpuPeriodMicros = 100000;

struct MountEntry {
    std::string point;
    std::string fstype;
    std::string super_options;
};

// A cgroup file's or a small /proc file's contents without the trailing newline, read with plain
// system calls (this is on every root run's path); empty if it cannot be read: without /proc
// there is no cgroup to find, not an error.
std::string read_text(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return {};
    try {
        std::string text = read_all(fd.get(), path);
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
            text.pop_back();
        }
        return text;
    } catch (const Error&) {
        return {};
    }
}

// The next space-separated field of `line`, consumed from it.
std::string_view next_field(std::string_view& line) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string_view::npos) {
        line = {};
        return {};
    }
    line.remove_prefix(start);
    const size_t end = std::min(line.find(' '), line.size());
    std::string_view field = line.substr(0, end);
    line.remove_prefix(end);
    return field;
}

// Calls `visit` with each line of `text`, without its newline.
template <typename Visit>
void for_each_line(std::string_view text, Visit visit) {
    while (!text.empty()) {
        const size_t end = std::min(text.find('\n'), text.size());
        visit(text.substr(0, end));
        text.remove_prefix(std::min(end + 1, text.size()));
    }
}

// mountinfo writes space, tab, newline and backslash in paths as octal escapes ("\040").
std::string unescape_mount_path(std::string_view escaped) {
    auto is_octal = [](char c) { return c >= '0' && c <= '7'; };
    std::string path;
    for (size_t i = 0; i < escaped.size(); ++i) {
        if (escaped[i] == '\\' && i + 3 < escaped.size() && is_octal(escaped[i + 1]) &&
            is_octal(escaped[i + 2]) && is_octal(escaped[i + 3])) {
            path.push_back(static_cast<char>((escaped[i + 1] - '0') * 64 +
                                             (escaped[i + 2] - '0') * 8 + (escaped[i + 3] - '0')));
            i += 3;
            continue;
        }
        path.push_back(escaped[i]);
    }
    return path;
}

std::vector<MountEntry> read_mounts() {
    const std::string text = read_text("/proc/self/mountinfo");
    std::vector<MountEntry> mounts;
    for_each_line(text, [&mounts](std::string_view line) {
        // "ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTS"
        for (int skipped = 0; skipped < 4; ++skipped) next_field(line);
        MountEntry entry;
        entry.point = unescape_mount_path(next_field(line));
        for (std::string_view field = next_field(line); !field.empty() && field != "-";
             field = next_field(line)) {
        }
        entry.fstype = next_field(line);
        next_field(line);  // source
        entry.super_options = next_field(line);
        if (!entry.point.empty()) mounts.push_back(std::move(entry));
    });
    return mounts;
}

// The caller's cgroup path in the v1 hierarchy holding `controller` ("N:a,b:PATH" lines of
// `proc_cgroup`, the text of /proc/self/cgroup).
std::optional<std::string> own_cgroup_path(std::string_view proc_cgroup,
                                           const std::string& controller) {
    std::optional<std::string> path;
    for_each_line(proc_cgroup, [&](std::string_view line) {
        const size_t first = line.find(':');
        if (path || first == std::string_view::npos) return;
        const size_t second = line.find(':', first + 1);
        if (second == std::string_view::npos) return;
        const std::string controllers =
            "," + std::string(line.substr(first + 1, second - first - 1)) + ",";
        if (controllers.find("," + controller + ",") != std::string::npos) {
            path = std::string(line.substr(second + 1));
        }
    });
    return path;
}

bool has_words(std::string_view list, std::initializer_list<const char*> words) {
    std::vector<std::string_view> present;
    for (std::string_view word = next_field(list); !word.empty(); word = next_field(list)) {
        present.push_back(word);
    }
    for (const char* word : words) {
        if (std::find(present.begin(), present.end(), word) == present.end()) return false;
    }
    return true;
}

void write_text(const std::string& path, const std::string& value) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || !write_all(fd.get(), value.data(), value.size())) {
        throw system_error("cannot write " + value + " to " + path);
    }
}

// For a limit file that only some kernels have (swap accounting): absent is not an error, and
// trying the write costs one system call less than asking first.
void write_text_if_present(const std::string& path, const std::string& value) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd && errno == ENOENT) return;
    if (!fd || !write_all(fd.get(), value.data(), value.size())) {
        throw system_error("cannot write " + value + " to " + path);
    }
}

std::string unique_name() {
    uint32_t random = 0;
    if (::getrandom(&random, sizeof random, 0) != sizeof random) random = 0;
    char name[64];
    (void)std::snprintf(name, sizeof name, "%s%d-%08x", kNamePrefix, static_cast<int>(::getpid()),
                        random);
    return name;
}

// Removes empty sandbox cgroups whose launcher died without cleaning up (kill -9), from every
// hierarchy in `parents` (in creation order). A launcher creates its cgroups in that order and
// removes them in the reverse one, so a name it left anywhere is also in the first: only that
// directory is listed.
void remove_stale_siblings(const std::vector<std::string>& parents) {
    if (parents.empty()) return;
    // A cgroup directory's link count is 2 plus its child cgroups (kernfs): with none left, there
    // is nothing to list, the usual case when sandboxes run one at a time.
    struct stat info {};
    if (::stat(parents.front().c_str(), &info) == 0 && info.st_nlink <= 2) return;
    // Unlistable: nothing of ours to sweep there.
    (void)for_each_directory_entry(parents.front(), [&](int, const std::string& name) {
        if (!name.starts_with(kNamePrefix)) return;
        const int pid = std::atoi(name.c_str() + std::strlen(kNamePrefix));
        if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) return;
        for (auto parent = parents.rbegin(); parent != parents.rend(); ++parent) {
            (void)::rmdir((*parent + "/" + name).c_str());  // fails harmlessly if still in use
        }
    });
}

std::string cpu_max(double cpus) {
    // Rounded to the nearest microsecond; cpus is positive and at most 4096 (parse_cpus). Not
    // std::llround, the binary's one use of libm, which would cost every start its loading.
    const double scaled = cpus * kCpuPeriodMicros;
    auto quota = static_cast<uint64_t>(scaled);
    if (scaled - static_cast<double>(quota) >= 0.5) ++quota;
    return std::to_string(quota < 1000 ? 1000 : quota) + " " + std::to_string(kCpuPeriodMicros);
}

}  // namespace

std::optional<SandboxCgroup> SandboxCgroup::plan(const SandboxConfig& config) {
    const ResourceLimits& limits = config.limits;
    // An ordinary user without --cgroup never gets one: skip reading the mount table.
    if (config.cgroup_parent.empty() && ::geteuid() != 0) return std::nullopt;
    const std::vector<MountEntry> mounts = read_mounts();
    SandboxCgroup cgroup;
    cgroup.limits_ = limits;

    std::string v2_parent;
    // Without --cgroup (so as root): root's own cgroups, "N:controllers:PATH" a hierarchy.
    const std::string proc_cgroup =
        config.cgroup_parent.empty() ? read_text("/proc/self/cgroup") : std::string();
    // A memory controller bound to a v1 hierarchy is in no cgroup2 mount's list: no need to read
    // those.
    const bool memory_on_v1 = own_cgroup_path(proc_cgroup, "memory").has_value();
    if (!config.cgroup_parent.empty()) {
        v2_parent = config.cgroup_parent;
        if (::access((v2_parent + "/cgroup.procs").c_str(), W_OK) != 0) {
            throw Error("--cgroup " + v2_parent +
                        ": not a cgroup v2 directory you can write (it must be delegated to you)");
        }
    } else if (::geteuid() == 0 && !memory_on_v1) {
        for (const auto& mount : mounts) {
            if (mount.fstype == "cgroup2" &&
                has_words(read_text(mount.point + "/cgroup.controllers"), {"memory", "pids"})) {
                v2_parent = mount.point + "/sqbox";
                if (::mkdir(v2_parent.c_str(), 0755) != 0 && errno != EEXIST) {
                    throw system_error("cannot create " + v2_parent);
                }
                break;
            }
        }
    }

    if (!v2_parent.empty()) {
        cgroup.mechanism_ = "cgroup-v2";
        const std::string available = read_text(v2_parent + "/cgroup.controllers");
        if (!has_words(available, {"memory", "pids"}) ||
            (limits.cpus && !has_words(available, {"cpu"}))) {
            throw Error("cgroup " + v2_parent + " lacks the memory, pids" +
                        std::string(limits.cpus ? " or cpu" : "") +
                        " controller (has: " + (available.empty() ? "none" : available) + ")");
        }
        const std::string wanted = limits.cpus ? "+memory +pids +cpu" : "+memory +pids";
        if (!has_words(read_text(v2_parent + "/cgroup.subtree_control"), {"memory", "pids"}) ||
            limits.cpus) {
            try {
                write_text(v2_parent + "/cgroup.subtree_control", wanted);
            } catch (const Error& e) {
                throw Error(e.what() + std::string(" (a cgroup delegated to sqbox must not hold "
                                                   "processes of its own)"));
            }
        }
        cgroup.directories_.push_back({v2_parent, "v2", "", UniqueFd()});
        cgroup.cpu_ = limits.cpus.has_value();
    } else if (::geteuid() == 0) {
        // cgroup v1, one hierarchy per controller.
        for (const char* controller : {"memory", "pids", "cpu"}) {
            const std::string name = controller;
            if (name == "cpu" && !limits.cpus) continue;
            const MountEntry* hierarchy = nullptr;
            for (const auto& mount : mounts) {
                if (mount.fstype == "cgroup" &&
                    ("," + mount.super_options + ",").find("," + name + ",") != std::string::npos) {
                    hierarchy = &mount;
                }
            }
            std::optional<std::string> own = own_cgroup_path(proc_cgroup, name);
            if (hierarchy == nullptr || !own) {
                if (name == "cpu") break;
                return std::nullopt;
            }
            const std::string parent = hierarchy->point + (*own == "/" ? "" : *own);
            cgroup.directories_.push_back({parent, name, "", UniqueFd()});
            if (name == "cpu") cgroup.cpu_ = true;
        }
        cgroup.mechanism_ = "cgroup-v1";
    } else {
        return std::nullopt;
    }
    return cgroup;
}

void SandboxCgroup::create() {
    const ResourceLimits& limits = limits_;
    const std::string name = unique_name();
    for (auto& directory : directories_) {
        const std::string path = directory.parent + "/" + name;
        if (::mkdir(path.c_str(), 0755) != 0) throw system_error("cannot create cgroup " + path);
        directory.path = path;
        const std::string& kind = directory.controller;
        if (kind == "v2" || kind == "memory") memory_dir_ = path;
        if (kind == "v2") {
            if (limits.memory_bytes) {
                write_text(path + "/memory.max", std::to_string(*limits.memory_bytes));
                write_text_if_present(path + "/memory.swap.max", "0");
            }
            if (limits.processes) write_text(path + "/pids.max", std::to_string(*limits.processes));
            if (limits.cpus) write_text(path + "/cpu.max", cpu_max(*limits.cpus));
        } else if (kind == "memory") {
            if (limits.memory_bytes) {
                const std::string bytes = std::to_string(*limits.memory_bytes);
                write_text(path + "/memory.limit_in_bytes", bytes);
                write_text_if_present(path + "/memory.memsw.limit_in_bytes", bytes);
            }
        } else if (kind == "pids") {
            if (limits.processes) write_text(path + "/pids.max", std::to_string(*limits.processes));
        } else if (kind == "cpu") {
            const std::string quota = cpu_max(*limits.cpus);
            write_text(path + "/cpu.cfs_period_us", std::to_string(kCpuPeriodMicros));
            write_text(path + "/cpu.cfs_quota_us", quota.substr(0, quota.find(' ')));
        }
        const std::string join = path + (kind == "v2" ? "/cgroup.procs" : "/tasks");
        directory.join.reset(::open(join.c_str(), O_WRONLY | O_CLOEXEC));
        if (!directory.join) throw system_error("cannot open " + join);
    }
}

SandboxCgroup::~SandboxCgroup() {
    remove();
}

void SandboxCgroup::remove() noexcept {
    // The reverse of the creation order (see remove_stale_siblings).
    for (auto directory = directories_.rbegin(); directory != directories_.rend(); ++directory) {
        directory->join.reset();
        if (directory->path.empty()) continue;  // planned, never created
        // The last processes may still be on their way out for a moment after init is reaped.
        for (int attempt = 0; attempt < 100; ++attempt) {
            if (::rmdir(directory->path.c_str()) == 0 || errno == ENOENT) break;
            if (errno != EBUSY) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    }
    // Here rather than at creation: the sandbox is gone, and this is off its start.
    if (!directories_.empty() && !directories_.front().path.empty()) {
        std::vector<std::string> parents;
        for (const auto& directory : directories_) parents.push_back(directory.parent);
        remove_stale_siblings(parents);
    }
    directories_.clear();
}

std::vector<int> SandboxCgroup::join_fds() const {
    std::vector<int> fds;
    for (const auto& directory : directories_) fds.push_back(directory.join.get());
    return fds;
}

bool SandboxCgroup::oom_killed() const {
    if (memory_dir_.empty()) return false;
    const std::string file = mechanism_ == "cgroup-v2" ? "/memory.events" : "/memory.oom_control";
    // "KEY VALUE" lines.
    bool killed = false;
    for_each_line(read_text(memory_dir_ + file), [&killed](std::string_view line) {
        if (next_field(line) == "oom_kill") {
            const std::string_view count = next_field(line);
            killed = killed || (!count.empty() && count != "0");
        }
    });
    return killed;
}

std::string cgroup_held_limits(const SandboxCgroup& cgroup) {
    std::string held;
    if (cgroup.limits_memory()) held += "memory ";
    if (cgroup.limits_processes()) held += "pids ";
    return held;
}

void drop_limits_held_by_cgroup(std::string_view held, ResourceLimits& rlimits) {
    for (std::string_view word = next_field(held); !word.empty(); word = next_field(held)) {
        if (word == "memory") rlimits.memory_bytes.reset();
        if (word == "pids") rlimits.processes.reset();
    }
}

}  // namespace sqbox

#include "runtime/cgroups.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
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

std::vector<MountEntry> read_mounts() {
    std::ifstream in("/proc/self/mountinfo");
    std::vector<MountEntry> mounts;
    std::string line;
    while (std::getline(in, line)) {
        // "ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTS"
        std::istringstream fields(line);
        std::string id, parent, dev, root, point, options, word;
        fields >> id >> parent >> dev >> root >> point >> options;
        while (fields >> word && word != "-") {
        }
        MountEntry entry;
        entry.point = point;
        fields >> entry.fstype >> word >> entry.super_options;
        mounts.push_back(entry);
    }
    return mounts;
}

// The caller's cgroup path in the v1 hierarchy holding `controller` ("N:a,b:PATH"), from
// /proc/self/cgroup.
std::optional<std::string> own_cgroup_path(const std::string& controller) {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
        size_t first = line.find(':');
        size_t second = line.find(':', first + 1);
        if (first == std::string::npos || second == std::string::npos) continue;
        std::string controllers = line.substr(first + 1, second - first - 1);
        std::string path = line.substr(second + 1);
        if (("," + controllers + ",").find("," + controller + ",") != std::string::npos) {
            return path;
        }
    }
    return std::nullopt;
}

bool has_words(const std::string& list, std::initializer_list<const char*> words) {
    std::istringstream in(list);
    std::vector<std::string> present{std::istream_iterator<std::string>(in), {}};
    for (const char* word : words) {
        if (std::find(present.begin(), present.end(), word) == present.end()) return false;
    }
    return true;
}

// A cgroup file's contents without the trailing newline; empty if it cannot be read.
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

void write_text(const std::string& path, const std::string& value) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
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

// Removes empty sandbox cgroups whose launcher died without cleaning up (kill -9).
void remove_stale_siblings(const std::string& parent) {
    DIR* dir = ::opendir(parent.c_str());
    if (dir == nullptr) return;
    while (dirent* entry = ::readdir(dir)) {
        std::string name = entry->d_name;
        if (!name.starts_with(kNamePrefix)) continue;
        const int pid = std::atoi(name.c_str() + std::strlen(kNamePrefix));
        if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
        (void)::rmdir((parent + "/" + name).c_str());  // fails harmlessly if still in use
    }
    ::closedir(dir);
}

std::string cpu_max(double cpus) {
    const auto quota = static_cast<uint64_t>(std::llround(cpus * kCpuPeriodMicros));
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
    if (!config.cgroup_parent.empty()) {
        v2_parent = config.cgroup_parent;
        if (::access((v2_parent + "/cgroup.procs").c_str(), W_OK) != 0) {
            throw Error("--cgroup " + v2_parent +
                        ": not a cgroup v2 directory you can write (it must be delegated to you)");
        }
    } else if (::geteuid() == 0) {
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
            std::optional<std::string> own = own_cgroup_path(name);
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
        remove_stale_siblings(directory.parent);
        const std::string path = directory.parent + "/" + name;
        if (::mkdir(path.c_str(), 0755) != 0) throw system_error("cannot create cgroup " + path);
        directory.path = path;
        const std::string& kind = directory.controller;
        if (kind == "v2" || kind == "memory") memory_dir_ = path;
        if (kind == "v2") {
            if (limits.memory_bytes) {
                write_text(path + "/memory.max", std::to_string(*limits.memory_bytes));
                if (::access((path + "/memory.swap.max").c_str(), F_OK) == 0) {
                    write_text(path + "/memory.swap.max", "0");
                }
            }
            if (limits.processes) write_text(path + "/pids.max", std::to_string(*limits.processes));
            if (limits.cpus) write_text(path + "/cpu.max", cpu_max(*limits.cpus));
        } else if (kind == "memory") {
            if (limits.memory_bytes) {
                const std::string bytes = std::to_string(*limits.memory_bytes);
                write_text(path + "/memory.limit_in_bytes", bytes);
                if (::access((path + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
                    write_text(path + "/memory.memsw.limit_in_bytes", bytes);
                }
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
    for (auto& directory : directories_) {
        directory.join.reset();
        if (directory.path.empty()) continue;  // planned, never created
        // The last processes may still be on their way out for a moment after init is reaped.
        for (int attempt = 0; attempt < 100; ++attempt) {
            if (::rmdir(directory.path.c_str()) == 0 || errno == ENOENT) break;
            if (errno != EBUSY) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
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
    std::istringstream in(read_text(memory_dir_ + file));
    std::string key;
    uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "oom_kill" && value > 0) return true;
    }
    return false;
}

}  // namespace sqbox

#include "runtime/payload.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "runtime/enroot_entrypoint.h"
#include "runtime/limits.h"
#include "runtime/sandbox_user.h"
#include "runtime/signals.h"
#include "runtime/stage_report.h"
#include "runtime/terminal.h"
#include "security/capabilities.h"
#include "security/landlock.h"
#include "security/seccomp_filter.h"
#include "util/errors.h"
#include "util/fd_passing.h"
#include "util/files.h"

namespace sqbox {
namespace {

// Bounds on what an image's /etc/environment may cost: the file, and the environment it builds
// (which must also fit execve's limits).
constexpr size_t kMaxEnvironmentFileBytes = size_t{64} * 1024;
constexpr size_t kMaxEnvironmentBytes = size_t{1024} * 1024;

void set_entry(EnvironmentEntries& env, const std::string& key, const std::string& value) {
    for (auto& [existing_key, existing_value] : env) {
        if (existing_key == key) {
            existing_value = value;
            return;
        }
    }
    env.emplace_back(key, value);
}

// The image is not trusted: its /etc/environment may be a FIFO (open would block), a device, or
// a tiny compressed file that expands to gigabytes. Read only a bounded regular file.
std::string read_image_environment() {
    UniqueFd fd(::open("/etc/environment", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd) {
        if (errno == ENOENT || errno == ELOOP) return {};
        throw system_error("cannot open the image's /etc/environment");
    }
    return read_bounded_regular_file(fd.get(), kMaxEnvironmentFileBytes,
                                     "the image's /etc/environment");
}

}  // namespace

void leave_callers_session(int terminal_fd) {
    reset_signal_handling();
    if (::setsid() < 0) throw system_error("setsid");
    if (terminal_fd >= 0) adopt_terminal(terminal_fd);  // its fd itself closes at exec
}

void enter_payload_environment(const SandboxConfig& config) {
    // The working directory inherited from init is not in the sandbox's tree: leave it for the
    // root before anything (--workdir included) is resolved against it.
    if (::chdir("/") != 0) throw system_error("chdir /");
    EnvironmentEntries env = build_payload_environment(config, read_image_environment());
    if (::clearenv() != 0) throw Error("cannot clear the environment");
    for (const auto& [key, value] : env) {
        if (::setenv(key.c_str(), value.c_str(), 1) != 0) {
            throw system_error("cannot set environment variable " + key);
        }
    }
    if (::chdir(config.workdir.c_str()) != 0) {
        const bool missing = errno == ENOENT || errno == ENOTDIR;
        if (!(config.workdir_optional && missing && ::chdir("/") == 0)) {
            throw system_error("--workdir " + config.workdir);
        }
    }
}

void prefer_payload_for_oom_kill() {
    // Best effort: a profile from a file may refuse the write, and the kernel may lack the file;
    // the memory limit holds either way, only the choice of victim is left to the kernel.
    const int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    const std::string value = std::to_string(kPayloadOomScoreAdj);
    (void)!::write(fd, value.data(), value.size());
    (void)::close(fd);
}

void close_descriptors_at_exec(int kept) {
    auto mark = [](unsigned first, unsigned last) {
        if (first <= last && ::syscall(SYS_close_range, first, last, CLOSE_RANGE_CLOEXEC) != 0) {
            throw system_error("close_range");
        }
    };
    if (kept < 3) {
        mark(3U, ~0U);
        return;
    }
    mark(3U, static_cast<unsigned>(kept) - 1);
    mark(static_cast<unsigned>(kept) + 1, ~0U);
}

void wait_until_root_ready(UniqueFd ready) {
    if (!ready) return;
    char word = 0;
    if (read_full(ready.get(), &word, 1) != 1 || word != kRootReady) ::_exit(kExitSqboxFailure);
}

std::string wait_for_pooled_request(UniqueFd ready) {
    std::optional<FdMessage> message = receive_fd_message(ready.get());
    if (!message) ::_exit(kExitSqboxFailure);  // init failed, and reports why itself
    if (!is_request_with_stdio(message)) {
        throw Error("the request reached the payload without its stdin, stdout and stderr");
    }
    install_request_stdio(*message);
    return std::move(message->text);
}

void exec_command(const SandboxPlan& plan, int status_fd, int rc_fd) {
    const SandboxConfig& config = *plan.config;
    std::vector<std::string> words = config.command;
    if (config.entrypoint == SandboxConfig::Entrypoint::kEnrootRc) {
        try {
            words = enroot_start_command(config, rc_fd);
        } catch (const Error& e) {
            fail_stage(status_fd, kExitSqboxFailure, e.what());
        }
    }
    std::vector<char*> argv;
    argv.reserve(words.size() + 1);
    for (const auto& word : words) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    // A login shell's argv[0] is "-sh": the file to run is the shell itself.
    const std::string& program =
        config.entrypoint == SandboxConfig::Entrypoint::kEnrootRc ? enroot_shell() : words[0];
    ::execvp(program.c_str(), argv.data());

    const int err = errno;
    if (err == ENOENT) {
        fail_stage(status_fd, kExitNotFound, program + ": command not found");
    }
    if (is_lost_image_server(err)) {
        // The image server died as the command was looked up: its line comes from the supervisor.
        fail_stage(status_fd, kExitSqboxFailure, system_error(program + ": cannot execute", err));
    }
    fail_stage(status_fd, kExitNotExecutable, program + ": cannot execute: " + std::strerror(err));
}

EnvironmentEntries build_payload_environment(const SandboxConfig& config,
                                             const std::string& image_environment) {
    const SandboxUser user = sandbox_user(config);
    EnvironmentEntries env = {
        {"PATH", kDefaultPayloadPath}, {"HOME", user.home}, {"USER", user.name},
        {"LOGNAME", user.name},        {"TERM", "xterm"},
    };
    // enroot substitutes from the caller's environment; sqbox run only from the sandbox's own.
    const EnvironmentEntries& variables =
        config.substitution_environment ? *config.substitution_environment : env;
    auto lookup = [&variables](const std::string& name) -> std::optional<std::string> {
        for (auto it = variables.rbegin(); it != variables.rend(); ++it) {
            if (it->first == name) return it->second;
        }
        return std::nullopt;
    };
    for (auto& [key, value] :
         parse_environment_file(image_environment, "/etc/environment", lookup)) {
        set_entry(env, key, value);
    }
    for (const auto& [key, value] : config.environment) set_entry(env, key, value);
    size_t total = 0;
    for (const auto& [key, value] : env) total += key.size() + value.size() + 2;
    if (total > kMaxEnvironmentBytes) {
        throw Error("the payload's environment would exceed " +
                    std::to_string(kMaxEnvironmentBytes / 1024 / 1024) + " MiB");
    }
    return env;
}

}  // namespace sqbox

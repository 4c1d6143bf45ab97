#include "runtime/enroot_entrypoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

std::string enroot_shell() {
    const char* shell = std::getenv("SHELL");
    if (shell != nullptr && *shell != '\0' && ::access(shell, R_OK | X_OK) == 0) return shell;
    return "/bin/sh";
}

UniqueFd make_rc_descriptor(const SandboxConfig& config) {
    if (config.entrypoint != SandboxConfig::Entrypoint::kEnrootRc || !config.rc_script) {
        return {};
    }
    // Not close-on-exec: the shell opens it after execve.
    UniqueFd fd(::memfd_create("enroot-rc", 0));
    if (!fd) throw system_error("cannot create the rc script's descriptor");
    if (!write_all(fd.get(), config.rc_script->data(), config.rc_script->size())) {
        throw system_error("cannot write the rc script");
    }
    return fd;
}

std::vector<std::string> enroot_start_command(const SandboxConfig& config, int rc_fd) {
    const std::string shell = enroot_shell();
    const std::string name = shell.substr(shell.rfind('/') + 1);
    std::vector<std::string> argv = {(config.login_shell ? "-" : "") + name};
    const std::string rc =
        rc_fd >= 0 ? "/proc/self/fd/" + std::to_string(rc_fd) : std::string("/etc/rc");
    const std::vector<std::string>& command = config.command;

    if (::access(rc.c_str(), F_OK) == 0) {
        argv.push_back(rc);
        argv.insert(argv.end(), command.begin(), command.end());
    } else if (!command.empty()) {
        const std::string& first = command.front();
        if (first.find(' ') != std::string::npos) {
            // A command line in one word: the shell parses it.
            argv.insert(argv.end(), {"-c", first, name});
            argv.insert(argv.end(), command.begin() + 1, command.end());
        } else if (::access(first.c_str(), F_OK) != 0 ||
                   ::access(first.c_str(), R_OK | X_OK) == 0) {
            argv.insert(argv.end(), {"-c", "exec \"$@\"", name});
            argv.insert(argv.end(), command.begin(), command.end());
        } else {
            // An existing file that is not executable: a shell script.
            argv.insert(argv.end(), command.begin(), command.end());
        }
    }
    return argv;
}

}  // namespace sqbox

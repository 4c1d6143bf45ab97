// enroot configuration scripts (`enroot start --conf FILE`): bash files whose `#ENROOT_*`
// directives set options and whose environ(), mounts() and rc() functions print extra
// environment, mounts and a command script.
//
// enroot sources the script on the host. sqbox never runs it there: the functions are evaluated
// by the host's shell inside a throw-away sandbox whose root is the host's own, read-only (with
// the caller's environment, working directory and the container's command as arguments), and
// only their output is used. Never by the container's image: its shell is not to be trusted with
// deciding host mounts. hooks() exists to change the host, so a script defining it is refused.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sqbox/config.h"

namespace sqbox::cli {

struct EnrootConf {
    std::string path;
    std::string text;
    std::map<std::string, std::string> directives;  // "#ENROOT_NAME=value" lines
    bool has_environ = false;
    bool has_mounts = false;
    bool has_rc = false;
};

// Reads and checks FILE. Throws Error for a missing or oversized file, or one defining hooks().
EnrootConf read_enroot_conf(const std::string& path);

struct EnrootConfOutput {
    std::string environ;            // what environ() printed (KEY=VALUE lines)
    std::string mounts;             // what mounts() printed (fstab lines)
    std::optional<std::string> rc;  // the body of rc(), when defined
};

// Runs the script's functions in a sandbox of the host's root (read-only, no mounts, `base`'s
// limits and profile), with `arguments` and `caller_environment`, and collects what they print.
// Throws Error if the evaluation fails.
EnrootConfOutput evaluate_enroot_conf(
    const EnrootConf& conf, const SandboxConfig& base, const std::vector<std::string>& arguments,
    const std::vector<std::pair<std::string, std::string>>& caller_environment);

}  // namespace sqbox::cli

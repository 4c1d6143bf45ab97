// enroot configuration scripts (`enroot start --conf FILE`): bash files whose `#ENROOT_*`
// directives set options and whose environ(), mounts() and rc() functions print extra
// environment, mounts and a command script.
//
// enroot sources the script on the host. sqbox never runs it there: the functions are evaluated
// inside a throwaway sandbox of the same image (with the caller's environment and the container's
// command as arguments), and only their output is used. hooks() exists to run host code, so a
// script that defines it is refused.
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

// Runs the script's functions in a sandbox built like `base` (same image and layer, read-only,
// no mounts) and collects what they print. Throws Error if the evaluation fails.
EnrootConfOutput evaluate_enroot_conf(const EnrootConf& conf, const SandboxConfig& base,
                                      const std::vector<std::string>& arguments);

}  // namespace sqbox::cli

// `sqbox run`: command-line front end of the core runtime.
#pragma once

#include <string>
#include <vector>

#include "sqbox/config.h"

namespace CLI {
class App;
}

namespace sqbox::cli {

struct RunOptions {
    SandboxConfig config;
    std::string json_path;  // --json FILE, empty when not requested
};

// Raw option values as CLI11 collects them, before validation.
struct RunArguments {
    std::string image;
    std::vector<std::string> command;
    std::vector<std::string> mounts;
    std::vector<std::string> env;
    std::string workdir = "/";
    std::string hostname = "sandbox";
    bool map_root = false;
    bool read_only = false;
    bool verbose = false;
    bool tty = false;
    std::string tmpfs_size;
    std::string image_server_idle;  // --image-server-idle
    std::string timeout;
    std::string cpu_time;
    std::string memory;
    std::string pids;
    std::string fsize;
    std::string nofile;
    std::string cpus;
    std::string cgroup;
    std::string seccomp = "default";
    std::string output_limit;
    std::string json;
    std::string proc;  // --proc: fresh or outer
};

// Declares the `run` subcommand's options on `app`, bound to `args`.
CLI::App* add_run_subcommand(CLI::App& app, RunArguments& args);

// Index of IMAGE in the words after "run": the first word that is neither an option nor an
// option's value (or the word after "--"). Everything after it is the payload's command, so
// "sqbox run img python3 -c ..." never parses "-c" as sqbox's own.
size_t find_image_argument(const CLI::App& run, const std::vector<std::string>& args);

// Validates and converts; throws Error with a one-line message naming the bad option.
// --env KEY copies KEY from the caller's environment.
RunOptions build_run_options(const RunArguments& args);

// Parses one --mount value "SRC:DST[:ro|rw]"; SRC must exist (it is canonicalised).
MountSpec parse_mount_option(const std::string& value);

// Runs the sandbox and writes --json; returns sqbox's exit status.
int execute_run(const RunOptions& options);

}  // namespace sqbox::cli

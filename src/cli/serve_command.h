// `sqbox serve`: command-line front end of the long-lived server (src/session/server.h).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace sqbox::cli {

struct ServeArguments {
    std::string image;
    std::string socket;
    unsigned max_parallel = 0;
    unsigned pool = 0;
    unsigned prestart = 0;
    bool zygote = false;
    std::vector<std::string> preload;
    std::vector<std::string> env;
    bool map_root = false;
    std::string tmpfs_size;
    std::string memory;
    std::string pids;
    std::string fsize;
    std::string nofile;
    std::string cgroup;
    std::string seccomp = "default";
    bool verbose = false;
};

CLI::App* add_serve_subcommand(CLI::App& app, ServeArguments& args);

// Validates the options and runs the server; returns sqbox's exit status.
int execute_serve(const ServeArguments& args);

}  // namespace sqbox::cli

#include "cli/run_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli/result_json.h"
#include "image/environment_file.h"
#include "runtime/rooted_path.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/sizes.h"
#include "warm_up/warm_up.h"

namespace sqbox::cli {
namespace {

std::string canonical_host_path(const std::string& path, const std::string& what) {
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::canonical(path, ec);
    if (ec) throw Error(what + ": " + path + ": " + ec.message());
    return canonical.string();
}

std::string normalised_sandbox_path(const std::string& path, const std::string& what) {
    if (path.empty() || path.front() != '/') {
        throw Error(what + ": " + (path.empty() ? "empty path" : path) +
                    " must be an absolute path inside the sandbox");
    }
    std::string normalised;
    for (const auto& part : path_components(path, what)) normalised += "/" + part;
    return normalised.empty() ? "/" : normalised;
}

std::pair<std::string, std::string> parse_env_option(const std::string& value) {
    size_t equals = value.find('=');
    std::string key = value.substr(0, equals);
    if (!is_valid_variable_name(key)) {
        throw Error("--env " + value + ": invalid variable name '" + key + "'");
    }
    if (equals != std::string::npos) return {key, value.substr(equals + 1)};
    const char* from_caller = std::getenv(key.c_str());
    if (from_caller == nullptr) return {key, std::string()};
    return {key, from_caller};
}

// A limit: a size or count, or "unlimited".
std::optional<uint64_t> size_limit(const std::string& text, const std::string& option) {
    if (text == "unlimited") return std::nullopt;
    return parse_size(text, option);
}

std::optional<uint64_t> count_limit(const std::string& text, const std::string& option) {
    if (text == "unlimited") return std::nullopt;
    return parse_count(text, option);
}

}  // namespace

CLI::App* add_run_subcommand(CLI::App& app, RunArguments& args) {
    CLI::App* run = app.add_subcommand(
        "run", "Run COMMAND in a fresh sandbox built from IMAGE (a .sqsh file or a directory)");
    run->add_option("IMAGE", args.image, "squashfs image (.sqsh) or root filesystem directory")
        ->required();
    run->add_option("-m,--mount", args.mounts, "bind-mount a host path: SRC:DST[:ro|rw]")
        ->type_name("SRC:DST[:MODE]")
        ->allow_extra_args(false);
    run->add_option("-e,--env", args.env, "set KEY=VAL, or copy KEY from your environment")
        ->type_name("KEY[=VAL]")
        ->allow_extra_args(false);
    run->add_option("-w,--workdir", args.workdir, "working directory inside the sandbox")
        ->capture_default_str();
    run->add_option("--hostname", args.hostname, "hostname inside the sandbox")
        ->capture_default_str();
    run->add_flag("--root", args.map_root, "appear as root (uid 0) inside, as enroot --root");
    run->add_flag("--read-only", args.read_only, "read-only root filesystem (writable /tmp)");
    run->add_option("--tmpfs-size", args.tmpfs_size,
                    "cap of each writable tmpfs: root layer, /tmp, /dev/shm (default 1G)")
        ->type_name("SIZE");
    run->add_option("--timeout", args.timeout, "wall-clock limit; exit 124 when exceeded")
        ->type_name("SECONDS");
    run->add_option("--cpu-time", args.cpu_time, "CPU time limit (RLIMIT_CPU)")
        ->type_name("SECONDS");
    run->add_option("--memory", args.memory,
                    "memory limit: cgroup memory.max, else RLIMIT_AS (default 4G; or unlimited)")
        ->type_name("SIZE");
    run->add_option("--pids", args.pids,
                    "process limit: cgroup pids.max, else RLIMIT_NPROC (default 512; or unlimited)")
        ->type_name("N");
    run->add_option("--cpus", args.cpus, "CPU share, e.g. 1.5 (cgroup cpu.max; needs a cgroup)")
        ->type_name("N");
    run->add_option("--fsize", args.fsize,
                    "largest file the payload may write (RLIMIT_FSIZE; default 1G; or unlimited)")
        ->type_name("SIZE");
    run->add_option("--nofile", args.nofile, "open file limit (RLIMIT_NOFILE; default 4096)")
        ->type_name("N");
    run->add_option("--cgroup", args.cgroup,
                    "delegated cgroup v2 directory to create the sandbox's cgroup in")
        ->type_name("DIR");
    run->add_option("--seccomp", args.seccomp,
                    "seccomp profile: default, strict, none, or a Docker-format JSON file")
        ->type_name("PROFILE")
        ->capture_default_str();
    run->add_option("--output-limit", args.output_limit,
                    "cap on the bytes of stdout and of stderr passed on (the rest is discarded)")
        ->type_name("BYTES");
    run->add_option("--json", args.json, "write a JSON result record to FILE")->type_name("FILE");
    run->add_flag("-t,--tty", args.tty,
                  "give the payload a terminal of its own (stdin must be a terminal)");
    run->add_flag("--learn-warm-up", args.learn_warm_up,
                  "add the names this run looks up, reads and lists in the .sqsh image to the "
                  "image's warm-up list, which later runs look up ahead of the payload and whose "
                  "files they unpack (run a command you trust)");
    run->add_flag("--no-warm-up", args.no_warm_up,
                  "use no warm-up list and no unpacked files: everything through the image server");
    run->add_flag("-v,--verbose", args.verbose, "report setup details on stderr");
    run->footer(
        "Everything after IMAGE (or after --) is the command, even words that look like "
        "options.");
    return run;
}

size_t find_image_argument(const CLI::App& run, const std::vector<std::string>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& arg = args[i];
        if (arg == "--") return i + 1 < args.size() ? i + 1 : args.size();
        if (arg.size() < 2 || arg[0] != '-') return i;
        if (arg.find('=') != std::string::npos) continue;  // --opt=value
        const CLI::Option* option = run.get_option_no_throw(arg);
        // A short option with its value attached ("-m/a:/b") is one word too.
        if (option == nullptr && arg[1] != '-' && arg.size() > 2) {
            option = run.get_option_no_throw(arg.substr(0, 2));
            if (option != nullptr) continue;
        }
        if (option != nullptr && option->get_items_expected_min() > 0) ++i;  // skip its value
    }
    return args.size();
}

MountSpec parse_mount_option(const std::string& value) {
    const std::string what = "--mount " + value;
    size_t first = value.find(':');
    if (first == std::string::npos) throw Error(what + ": expected SRC:DST[:ro|rw]");
    size_t second = value.find(':', first + 1);
    MountSpec mount;
    mount.origin = what;
    std::string source = value.substr(0, first);
    std::string destination = value.substr(
        first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
    if (second != std::string::npos) {
        std::string mode = value.substr(second + 1);
        if (mode == "ro") {
            mount.read_only = true;
        } else if (mode != "rw") {
            throw Error(what + ": unknown mode '" + mode + "' (expected ro or rw)");
        }
    }
    if (source.empty()) throw Error(what + ": empty source path");
    mount.source = canonical_host_path(source, what);
    mount.destination = normalised_sandbox_path(destination, what);
    if (mount.destination == "/") throw Error(what + ": cannot mount over the sandbox's root");
    return mount;
}

RunOptions build_run_options(const RunArguments& args) {
    RunOptions options;
    SandboxConfig& config = options.config;
    if (args.command.empty()) throw Error("run: no command given (sqbox run IMAGE -- COMMAND...)");
    config.command = args.command;
    std::error_code ec;
    std::filesystem::path image = std::filesystem::absolute(args.image, ec);
    if (ec) throw Error("image " + args.image + ": " + ec.message());
    config.image = std::filesystem::is_directory(image, ec)
                       ? canonical_host_path(image.string(), "image")
                       : image.lexically_normal().string();
    for (const auto& value : args.mounts) config.mounts.push_back(parse_mount_option(value));
    for (const auto& value : args.env) config.environment.push_back(parse_env_option(value));
    config.workdir = normalised_sandbox_path(args.workdir, "--workdir");
    if (args.hostname.empty() || args.hostname.size() > 64) {
        throw Error("--hostname: must be 1 to 64 characters");
    }
    config.hostname = args.hostname;
    config.map_root = args.map_root;
    config.read_only_root = args.read_only;
    config.verbose = args.verbose;
    config.tty = args.tty;
    config.learn_warm_up = args.learn_warm_up;
    config.use_warm_up_list = !args.no_warm_up;
    config.warm_up_directory = default_warm_up_directory();
    if (!args.tmpfs_size.empty()) {
        config.tmpfs_size_bytes = parse_size(args.tmpfs_size, "--tmpfs-size");
    }
    if (!args.timeout.empty()) config.timeout_seconds = parse_seconds(args.timeout, "--timeout");
    if (!args.cpu_time.empty()) {
        config.limits.cpu_seconds = parse_count(args.cpu_time, "--cpu-time");
    }
    ResourceLimits& limits = config.limits;
    if (!args.memory.empty()) limits.memory_bytes = size_limit(args.memory, "--memory");
    if (!args.pids.empty()) limits.processes = count_limit(args.pids, "--pids");
    if (!args.fsize.empty()) limits.file_size_bytes = size_limit(args.fsize, "--fsize");
    if (!args.nofile.empty()) limits.open_files = count_limit(args.nofile, "--nofile");
    if (!args.cpus.empty()) {
        limits.cpus = parse_cpus(args.cpus, "--cpus");
    }
    if (!args.cgroup.empty()) config.cgroup_parent = canonical_host_path(args.cgroup, "--cgroup");
    if (args.seccomp.empty()) throw Error("--seccomp: empty profile name");
    config.seccomp_profile = args.seccomp;
    if (!args.output_limit.empty()) {
        config.output_limit_bytes = parse_size(args.output_limit, "--output-limit", true);
    }
    config.outside_uid = ::geteuid();
    config.outside_gid = ::getegid();
    options.json_path = args.json;
    return options;
}

int execute_run(const RunOptions& options) {
    // Opened first so that an unwritable path fails before anything runs.
    std::optional<JsonResultFile> json;
    if (!options.json_path.empty()) json.emplace(options.json_path);
    RunResult result = run_sandbox(options.config);
    if (json && !json->write(result)) {
        print_error("cannot write --json " + options.json_path);
        return kExitSqboxFailure;
    }
    return result.exit_status;
}

}  // namespace sqbox::cli

#include "cli/run_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli/result_json.h"
#include "config/config_validation.h"
#include "runtime/sandbox_user.h"
#include "runtime/signals.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"

namespace sqbox::cli {
namespace {

std::pair<std::string, std::string> parse_env_option(const std::string& value) {
    auto [name, assigned] = validate::variable_assignment(value, "--env " + value);
    if (assigned) return {std::move(name), std::move(*assigned)};
    const char* from_caller = std::getenv(name.c_str());
    return {name, from_caller == nullptr ? std::string() : std::string(from_caller)};
}

// --image-server-idle, else $SQBOX_IMAGE_SERVER_IDLE, else the default.
unsigned image_server_idle_or_default(const std::string& option) {
    if (!option.empty()) return validate::image_server_idle_seconds(option, "--image-server-idle");
    const char* variable = std::getenv("SQBOX_IMAGE_SERVER_IDLE");
    if (variable != nullptr && *variable != 0) {
        return validate::image_server_idle_seconds(variable, "SQBOX_IMAGE_SERVER_IDLE");
    }
    return kDefaultImageServerIdleSeconds;
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
                    "the sandbox's writable space: root layer, /tmp and /dev/shm together "
                    "(one tmpfs; default 1G)")
        ->type_name("SIZE");
    run->add_option("--timeout", args.timeout, "wall-clock limit; exit 124 when exceeded")
        ->type_name("SECONDS");
    run->add_option("--cpu-time", args.cpu_time, "CPU time limit (RLIMIT_CPU)")
        ->type_name("SECONDS");
    run->add_option("--memory", args.memory,
                    "memory limit: cgroup memory.max, else RLIMIT_DATA per process (default 4G; or "
                    "unlimited)")
        ->type_name("SIZE");
    run->add_option("--pids", args.pids,
                    "process limit: cgroup pids.max, else RLIMIT_NPROC (default 512; or unlimited)")
        ->type_name("N");
    run->add_option("--cpus", args.cpus, "CPU share, e.g. 1.5 (cgroup cpu.max; needs a cgroup)")
        ->type_name("N");
    run->add_option("--fsize", args.fsize,
                    "largest file the payload may write (RLIMIT_FSIZE; default unlimited)")
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
                    "cap on the bytes of stdout and of stderr passed on to a caller that is not a "
                    "terminal; the rest is discarded (default 16M; or unlimited)")
        ->type_name("BYTES");
    run->add_option("--json", args.json, "write a JSON result record to FILE")->type_name("FILE");
    run->add_flag("-t,--tty", args.tty,
                  "give the payload a terminal of its own (stdin must be a terminal)");
    run->add_flag("--no-warm-up")
        ->description(
            "has no effect since warm-up lists were removed; accepted so existing scripts keep "
            "working");
    run->add_option("--image-server-idle", args.image_server_idle,
                    "seconds the shared image server of a .sqsh stays after its last sandbox "
                    "(default 60, or $SQBOX_IMAGE_SERVER_IDLE); 0: this sandbox serves the image "
                    "itself (docs/run.md)")
        ->type_name("SECONDS");
    run->add_flag("-v,--verbose", args.verbose, "report setup details on stderr");
    run->add_option("--proc", args.proc,
                    "the sandbox's /proc: fresh (default), or outer: your own /proc, where a fresh "
                    "one is refused (shows your processes to the payload; see SECURITY.md)")
        ->type_name("fresh|outer");
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
    std::string source = value.substr(0, first);
    std::string destination = value.substr(
        first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
    bool read_only = false;
    if (second != std::string::npos) {
        std::string mode = value.substr(second + 1);
        if (mode == "ro") {
            read_only = true;
        } else if (mode != "rw") {
            throw Error(what + ": unknown mode '" + mode + "' (expected ro or rw)");
        }
    }
    MountSpec mount = validate::host_bind_mount(source, destination, read_only, what);
    mount.origin = what;
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
                       ? validate::host_path(image.string(), "image")
                       : image.lexically_normal().string();
    for (const auto& value : args.mounts) config.mounts.push_back(parse_mount_option(value));
    for (const auto& value : args.env) config.environment.push_back(parse_env_option(value));
    config.workdir = validate::working_directory(args.workdir, "--workdir");
    config.hostname = validate::hostname(args.hostname, "--hostname");
    config.map_root = args.map_root;
    config.read_only_root = args.read_only;
    config.verbose = args.verbose;
    config.tty = args.tty;
    config.image_server_idle_seconds = image_server_idle_or_default(args.image_server_idle);
    if (!args.tmpfs_size.empty()) {
        config.tmpfs_size_bytes = validate::tmpfs_size(args.tmpfs_size, "--tmpfs-size");
    }
    if (!args.timeout.empty()) {
        config.timeout_seconds = validate::timeout_seconds(args.timeout, "--timeout");
    }
    ResourceLimits& limits = config.limits;
    if (!args.cpu_time.empty()) {
        limits.cpu_seconds = validate::cpu_time_limit(args.cpu_time, "--cpu-time");
    }
    if (!args.memory.empty()) limits.memory_bytes = validate::memory_limit(args.memory, "--memory");
    if (!args.pids.empty()) limits.processes = validate::process_limit(args.pids, "--pids");
    if (!args.fsize.empty()) {
        limits.file_size_bytes = validate::file_size_limit(args.fsize, "--fsize");
    }
    if (!args.nofile.empty()) {
        limits.open_files = validate::open_files_limit(args.nofile, "--nofile");
    }
    if (!args.cpus.empty()) limits.cpus = validate::cpu_share(args.cpus, "--cpus");
    if (!args.cgroup.empty()) config.cgroup_parent = validate::host_path(args.cgroup, "--cgroup");
    config.seccomp_profile = validate::seccomp_profile(args.seccomp, "--seccomp");
    if (!args.output_limit.empty()) {
        config.output_limit_bytes =
            validate::output_limit_or_unlimited(args.output_limit, "--output-limit");
    }
    if (args.proc == "outer") {
        config.proc_view = SandboxConfig::ProcView::kOuter;
    } else if (!args.proc.empty() && args.proc != "fresh") {
        throw Error("--proc: '" + args.proc + "' is neither fresh nor outer");
    }
    set_caller_identity(config);
    options.json_path = args.json;
    return options;
}

int execute_run(const RunOptions& options) {
    // Held from here: one that comes before the sandbox starts still leaves the record.
    const ScopedSignalBlock hold_signals;
    // Opened first so that an unwritable path fails before anything runs.
    std::optional<JsonResultFile> json;
    if (!options.json_path.empty()) json.emplace(options.json_path);
    bool written = true;
    const RunResult result = run_sandbox(options.config, [&](const RunResult& ended) {
        // The sandbox is gone (or never was): a signal for it that comes now (scancel sends
        // SIGTERM to every process of a job, then the batch script passes its own on) has nobody
        // to go to, and must not end sqbox before the record is written, nor change its status.
        ignore_forwarded_signals();
        if (json) written = json->write(ended);
    });
    if (!written) {
        print_error("cannot write --json " + options.json_path);
        return kExitSqboxFailure;
    }
    return result.exit_status;
}

}  // namespace sqbox::cli

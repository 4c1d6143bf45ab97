#include "cli/serve_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli/run_command.h"
#include "security/zygote_seccomp.h"
#include "session/prestart.h"
#include "session/server.h"
#include "util/errors.h"
#include "util/sizes.h"

namespace sqbox::cli {

CLI::App* add_serve_subcommand(CLI::App& app, ServeArguments& args) {
    CLI::App* serve = app.add_subcommand(
        "serve",
        "Serve IMAGE: start sandboxes and Python sessions on request (line-delimited JSON on "
        "stdin/stdout, see src/session/PROTOCOL.md)");
    serve->add_option("IMAGE", args.image, "squashfs image (.sqsh) or root filesystem directory")
        ->required();
    serve
        ->add_option("--socket", args.socket, "also accept clients on this Unix socket (mode 0600)")
        ->type_name("PATH");
    serve
        ->add_option("--max-parallel", args.max_parallel,
                     "sandboxes of run requests at once (default: twice the CPU count)")
        ->type_name("N");
    serve
        ->add_option("--pool", args.pool,
                     "keep N sandboxes set up ahead for run requests without mounts or own "
                     "memory/pids limits (each used once)")
        ->type_name("N");
    serve
        ->add_option("--prestart", args.prestart,
                     "keep N Python interpreters started ahead for run_python requests, each in a "
                     "sandbox of its own used once")
        ->type_name("N");
    serve->add_flag("--zygote", args.zygote,
                    "serve run_python requests in sandboxes forked from one warm interpreter "
                    "(docs/serve.md: it trusts the image's python3 with each sandbox's making)");
    serve
        ->add_option("--preload", args.preload,
                     "modules the pre-started interpreters (or the zygote) import before any "
                     "request (comma-separated, repeatable)")
        ->delimiter(',')
        ->type_name("MODULE,...");
    serve->add_option("-e,--env", args.env, "set KEY=VAL in every sandbox")->type_name("KEY=VAL");
    serve->add_flag("--root", args.map_root, "appear as root (uid 0) inside every sandbox");
    serve
        ->add_option(
            "--tmpfs-size", args.tmpfs_size,
            "writable space of a sandbox: root layer, /tmp and /dev/shm together (default 1G)")
        ->type_name("SIZE");
    serve->add_option("--memory", args.memory, "default memory limit of a sandbox (default 4G)")
        ->type_name("SIZE");
    serve->add_option("--pids", args.pids, "default process limit (default 512)")->type_name("N");
    serve->add_option("--fsize", args.fsize, "largest file a payload may write (default unlimited)")
        ->type_name("SIZE");
    serve->add_option("--nofile", args.nofile, "open file limit (default 4096)")->type_name("N");
    serve->add_option("--cgroup", args.cgroup, "delegated cgroup v2 directory for the sandboxes")
        ->type_name("DIR");
    serve->add_option("--seccomp", args.seccomp, "seccomp profile of every sandbox")
        ->type_name("PROFILE")
        ->capture_default_str();
    serve->add_flag("-v,--verbose", args.verbose, "report setup details on stderr");
    return serve;
}

int execute_serve(const ServeArguments& args) {
    // The same validation as `sqbox run`, on a run with no command.
    RunArguments run;
    run.image = args.image;
    run.command = {"serve"};
    run.env = args.env;
    run.map_root = args.map_root;
    run.tmpfs_size = args.tmpfs_size;
    run.memory = args.memory;
    run.pids = args.pids;
    run.fsize = args.fsize;
    run.nofile = args.nofile;
    run.cgroup = args.cgroup;
    run.seccomp = args.seccomp;
    run.verbose = args.verbose;
    ServeOptions options;
    options.base = build_run_options(run).config;
    options.base.command.clear();
    // The server holds what it captures, and a request's kind decides how much (jobs.h,
    // session_state.h), unless the request says.
    options.base.output_limit_bytes.reset();
    options.max_parallel = args.max_parallel;
    options.pool = args.pool;
    options.prestart = args.prestart;
    for (const std::string& module : args.preload) check_preload_module(module);
    if (!args.preload.empty() && args.prestart == 0 && !args.zygote) {
        throw Error(
            "--preload: pre-started interpreters or the zygote import it; give --prestart N or "
            "--zygote too");
    }
    if (args.zygote && args.prestart != 0) {
        throw Error("--zygote and --prestart both serve run_python: choose one");
    }
    if (args.zygote) check_zygote_seccomp_choice(options.base.seccomp_profile);
    if (args.zygote && (options.base.map_root || options.base.outside_uid == 0)) {
        // Mapping a parent's uid 0 into a new user namespace takes CAP_SETFCAP there, which no
        // payload keeps (user_namespace.c, verify_root_map).
        throw Error(
            "--zygote: not as root or with --root: the kernel lets the zygote make a user "
            "namespace for a request only as a user other than root");
    }
    options.zygote = args.zygote;
    options.preload = args.preload;
    if (!args.socket.empty()) {
        options.socket_path = std::filesystem::absolute(args.socket).lexically_normal().string();
    }
    return run_server(options);
}

}  // namespace sqbox::cli

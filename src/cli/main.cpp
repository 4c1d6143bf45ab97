// sqbox: command-line entry point.
#include <csignal>
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/run_command.h"
#include "util/errors.h"

namespace {

std::string program_version() { return "sqbox 0.1.0"; }

int run_main(int argc, char** argv) {
    CLI::App app{"sqbox: a rootless, isolated sandbox for running commands from squashfs images"};
    app.set_version_flag("--version", program_version());
    app.require_subcommand(1);
    sqbox::cli::RunArguments run_args;
    CLI::App* run = sqbox::cli::add_run_subcommand(app, run_args);

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        std::cout << app.help();
        return 0;
    } catch (const CLI::CallForVersion&) {
        std::cout << program_version() << "\n";
        return 0;
    } catch (const CLI::ParseError& e) {
        sqbox::print_error(std::string(e.what()) + " (see sqbox --help)");
        return sqbox::kExitSqboxFailure;
    }

    if (run->parsed()) {
        // prefix_command() leaves everything after IMAGE (minus a leading "--") here.
        std::vector<std::string> rest = run->remaining();
        if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
        run_args.command.insert(run_args.command.end(), rest.begin(), rest.end());
        try {
            return sqbox::cli::execute_run(sqbox::cli::build_run_options(run_args));
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    return sqbox::kExitSqboxFailure;
}

}  // namespace

int main(int argc, char** argv) {
    // An inherited "ignore SIGCHLD" would make the kernel reap our children before we can.
    (void)std::signal(SIGCHLD, SIG_DFL);
    try {
        return run_main(argc, argv);
    } catch (const std::exception& e) {
        sqbox::print_error(std::string("internal error: ") + e.what());
        return sqbox::kExitSqboxFailure;
    }
}

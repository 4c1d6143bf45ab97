// sqbox: command-line entry point.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>

#include "cli/doctor_command.h"
#include "cli/enroot_command.h"
#include "cli/import_command.h"
#include "cli/run_command.h"
#include "cli/seccomp_command.h"
#include "cli/serve_command.h"
#include "runtime/shared_image.h"
#include "util/errors.h"

namespace {

std::string program_version() {
    return "sqbox 0.1.0";
}

int run_main(int argc, char** argv) {
    CLI::App app{"sqbox: a rootless, isolated sandbox for running commands from squashfs images"};
    app.set_version_flag("--version", program_version());
    app.require_subcommand(1);
    sqbox::cli::RunArguments run_args;
    CLI::App* run = sqbox::cli::add_run_subcommand(app, run_args);
    sqbox::cli::ServeArguments serve_args;
    CLI::App* serve = sqbox::cli::add_serve_subcommand(app, serve_args);
    sqbox::cli::SeccompCheckArguments check_args;
    CLI::App* seccomp_check = sqbox::cli::add_seccomp_subcommand(app, check_args);
    sqbox::cli::ImportArguments import_args;
    CLI::App* import = sqbox::cli::add_import_subcommand(app, import_args);
    sqbox::cli::DoctorArguments doctor_args;
    CLI::App* doctor = sqbox::cli::add_doctor_subcommand(app, doctor_args);
    // Started by sqbox run itself (runtime/shared_image.h); not listed in the help.
    std::string image_server_socket;
    unsigned image_server_idle = 0;
    CLI::App* image_server = app.add_subcommand("image-server", "")->group("");
    image_server->add_option("--socket", image_server_socket)->required();
    image_server->add_option("--idle", image_server_idle)->required();

    // Split "run [OPTIONS] IMAGE [--] COMMAND..." ourselves: CLI11 sees only up to IMAGE.
    std::vector<std::string> words(argv + 1, argv + argc);
    std::vector<std::string> command;
    if (!words.empty() && words.front() == "run") {
        std::vector<std::string> run_words(words.begin() + 1, words.end());
        size_t image = sqbox::cli::find_image_argument(*run, run_words);
        if (image < run_words.size()) {
            auto rest = run_words.begin() + static_cast<std::ptrdiff_t>(image) + 1;
            if (rest != run_words.end() && *rest == "--") ++rest;
            command.assign(rest, run_words.end());
            run_words.erase(run_words.begin() + static_cast<std::ptrdiff_t>(image) + 1,
                            run_words.end());
            if (image > 0 && run_words[image - 1] == "--") {
                run_words.erase(run_words.begin() + static_cast<std::ptrdiff_t>(image) - 1);
            }
        }
        words.resize(1);
        words.insert(words.end(), run_words.begin(), run_words.end());
    }
    std::reverse(words.begin(), words.end());  // CLI11 parses a reversed vector

    try {
        app.parse(words);
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

    if (image_server->parsed()) {
        try {
            return sqbox::serve_shared_image(image_server_socket, image_server_idle);
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    if (run->parsed()) {
        run_args.command = std::move(command);
        try {
            return sqbox::cli::execute_run(sqbox::cli::build_run_options(run_args));
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    if (serve->parsed()) {
        try {
            return sqbox::cli::execute_serve(serve_args);
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    if (import->parsed()) {
        try {
            sqbox::cli::execute_import(import_args);
            return 0;
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    if (doctor->parsed()) {
        try {
            return sqbox::cli::execute_doctor(doctor_args);
        } catch (const sqbox::Error& e) {
            sqbox::print_error(e.what());
            return sqbox::kExitSqboxFailure;
        }
    }
    if (seccomp_check->parsed()) return sqbox::cli::execute_seccomp_check(check_args);
    return sqbox::kExitSqboxFailure;
}

}  // namespace

int main(int argc, char** argv) {
    // An inherited "ignore SIGCHLD" would make the kernel reap our children before we can.
    (void)std::signal(SIGCHLD, SIG_DFL);
    try {
        // Installed as "enroot" (a symlink on PATH) or asked for: enroot's command line.
        const std::string name = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "";
        if (name == "enroot") {
            return sqbox::cli::enroot_main(name, std::vector<std::string>(argv + 1, argv + argc));
        }
        if (argc > 1 && std::string(argv[1]) == "enroot") {
            return sqbox::cli::enroot_main("sqbox enroot",
                                           std::vector<std::string>(argv + 2, argv + argc));
        }
        return run_main(argc, argv);
    } catch (const std::exception& e) {
        sqbox::print_error(std::string("internal error: ") + e.what());
        return sqbox::kExitSqboxFailure;
    }
}

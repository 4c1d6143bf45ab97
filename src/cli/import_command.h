// `sqbox import URI [-o FILE]`: an image from a registry (docker://, import/registry.h), a local
// engine (dockerd://, podman://, import/engine_sources.h) or the local disk
// (import/local_sources.h) becomes one enroot-style squashfs image. The enroot front
// end's import, load and digest use the same functions.
#pragma once

#include <filesystem>
#include <string>

namespace CLI {
class App;
}

namespace sqbox::cli {

struct ImportArguments {
    std::string uri;
    std::string output;
    std::string architecture;  // enroot's -a (x86_64, aarch64, ppc64le) or Go's names
    std::string compression = "zstd";
    bool verbose = false;  // how the layer reader is confined, on stderr
};

CLI::App* add_import_subcommand(CLI::App& app, ImportArguments& args);

// Imports; throws Error with one line on failure.
void execute_import(const ImportArguments& args);

// The name enroot gives an imported image without -o (without ".sqsh"): for docker:// URIs
// "IMAGE+TAG" with '/' as '+' and Docker Hub's "library/" dropped; for dockerd:// and podman://
// the image with '/' and ':' as '+'; for local sources the file or directory name without its
// .tar extension.
std::string default_image_name(const std::string& uri);

// Writes the image of `uri` to `output` (which must not exist).
void import_image(const std::string& uri, const std::filesystem::path& output,
                  const std::string& architecture, const std::string& compression);

// The manifest digest `uri` resolves to (enroot digest).
std::string image_digest(const std::string& uri, const std::string& architecture);

}  // namespace sqbox::cli

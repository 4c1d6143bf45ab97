#include "cli/import_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <regex>

#include "cli/enroot_settings.h"
#include "import/engine_sources.h"
#include "import/image_import.h"
#include "import/local_sources.h"
#include "import/registry.h"
#include "security/landlock.h"
#include "util/errors.h"

namespace sqbox::cli {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

std::string environment_or(const char* name, const std::string& fallback) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

// enroot's ENROOT_CACHE_PATH: $XDG_CACHE_HOME/enroot, or ~/.cache/enroot.
std::filesystem::path enroot_cache_path() {
    if (const char* path = std::getenv("ENROOT_CACHE_PATH"); path != nullptr && *path != '\0') {
        return path;
    }
    const std::string home = environment_or("HOME", "/");
    return std::filesystem::path(environment_or("XDG_CACHE_HOME", home + "/.cache")) / "enroot";
}

RegistryOptions registry_options(const std::string& architecture) {
    RegistryOptions options;
    options.architecture = architecture.empty() ? "" : go_architecture(architecture);
    options.cache_dir = enroot_cache_path();
    options.config_dir = load_enroot_settings().config_path;
    options.allow_http = enroot_flag(std::getenv("ENROOT_ALLOW_HTTP"));
    options.progress = ::isatty(STDERR_FILENO) == 1;
    apply_enroot_transfer_settings(options);  // ENROOT_CONNECT_TIMEOUT and the like
    return options;
}

std::optional<int64_t> source_date_epoch() {
    const char* value = std::getenv("SOURCE_DATE_EPOCH");
    if (value == nullptr || *value == '\0') return std::nullopt;
    char* end = nullptr;
    const long long seconds = std::strtoll(value, &end, 10);
    if (*end != '\0' || seconds < 0)
        throw Error("SOURCE_DATE_EPOCH is not a number: " + std::string(value));
    return seconds;
}

}  // namespace

CLI::App* add_import_subcommand(CLI::App& app, ImportArguments& args) {
    CLI::App* import = app.add_subcommand(
        "import", "Make a squashfs image (enroot's format) from a registry image or an archive");
    import
        ->add_option("URI", args.uri,
                     "docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST], dockerd://IMAGE, "
                     "podman://IMAGE, oci:DIR[:REF] (or DIR), oci-archive:FILE[:REF] or "
                     "docker-archive:FILE[:REF]")
        ->required();
    import->add_option("-o,--output", args.output,
                       "The image file to write (default: enroot's name for URI, in the current "
                       "directory); must not exist");
    import->add_option("-a,--arch", args.architecture,
                       "Architecture of a multi-architecture image (default: the host's)");
    import->add_option(
        "--compression", args.compression,
        "Squashfs compression: zstd (default, level 6), gzip, xz or none (data stored as is)");
    import->add_flag("-v,--verbose", args.verbose,
                     "Report how the process reading the layers is confined, on stderr");
    return import;
}

std::string default_image_name(const std::string& uri) {
    if (starts_with(uri, "docker://")) {
        // enroot's docker::_parse_uri, reduced to what the name needs.
        static const std::regex with_registry(
            R"(^docker://([^@]+@)?([^/#]+)/([a-z0-9/._-]+)(:([A-Za-z0-9._:-]+))?(@(sha256:[A-Za-z0-9]+))?$)");
        static const std::regex hub_image(
            R"(^docker://([^@]+@)?([^/@#:]+)(:([A-Za-z0-9._:-]+))?(@(sha256:[A-Za-z0-9]+))?$)");
        static const std::regex enroot_form(
            R"(^docker://([^@]+@)?([^#/@]+)#([a-z0-9/._-]+)(:([A-Za-z0-9._:-]+))?(@(sha256:[A-Za-z0-9]+))?$)");
        std::smatch match;
        std::string registry;
        std::string image;
        std::string tag;
        if (std::regex_match(uri, match, enroot_form)) {
            registry = match[2];
            image = match[3];
            tag = match[7].matched ? match[7].str() : match[5].str();
        } else if (std::regex_match(uri, match, with_registry)) {
            const std::string first = match[2];
            const bool is_registry = first.find_first_of(".:") != std::string::npos;
            registry = is_registry ? first : "registry-1.docker.io";
            image = is_registry ? match[3].str() : first + "/" + match[3].str();
            tag = match[7].matched ? match[7].str() : match[5].str();
        } else if (std::regex_match(uri, match, hub_image)) {
            registry = "registry-1.docker.io";
            image = "library/" + match[2].str();
            tag = match[6].matched ? match[6].str() : match[4].str();
        } else {
            throw Error("Invalid image reference: " + uri);
        }
        if (registry == "registry-1.docker.io" && starts_with(image, "library/")) {
            image = image.substr(8);
        }
        std::replace(image.begin(), image.end(), '/', '+');
        return tag.empty() ? image : image + "+" + tag;
    }
    if (is_engine_image_uri(uri)) {
        // enroot: the image as given, with ':' and '/' as '+'.
        std::string name = parse_engine_uri(uri).image;
        std::replace(name.begin(), name.end(), '/', '+');
        std::replace(name.begin(), name.end(), ':', '+');
        return name;
    }
    std::string path = uri;
    for (const char* scheme : {"oci-archive:", "docker-archive:", "oci:"}) {
        if (starts_with(path, scheme)) {
            path = path.substr(std::string(scheme).size());
            break;
        }
    }
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    std::string name = std::filesystem::path(path).filename().string();
    for (const char* extension : {".tar.gz", ".tar.zst", ".tgz", ".tar"}) {
        const std::string suffix = extension;
        if (name.size() > suffix.size() && name.ends_with(suffix)) {
            name.resize(name.size() - suffix.size());
            break;
        }
    }
    std::replace(name.begin(), name.end(), ':', '+');
    if (name.empty() || name == "." || name == "..")
        throw Error("cannot name an image after " + uri);
    return name;
}

void import_image(const std::string& uri, const std::filesystem::path& output,
                  const std::string& architecture, const std::string& compression) {
    ImportOptions options;
    options.compression = parse_squashfs_compression(compression);
    options.provenance = uri;
    options.source_date_epoch = source_date_epoch();
    const std::filesystem::path target = std::filesystem::absolute(output);
    if (starts_with(uri, "docker://")) {
        const ImageLayers image = pull_from_registry(uri, registry_options(architecture));
        write_image_from_layers(image, target, options);
        return;
    }
    if (is_engine_image_uri(uri)) {
        const std::unique_ptr<LocalImage> local = open_engine_image(uri, target.parent_path());
        write_image_from_layers(local->image, target, options);
        return;
    }
    if (!is_local_image_uri(uri)) {
        throw Error("Invalid image reference: " + uri +
                    " (docker://, dockerd://, podman://, oci:, oci-archive:, docker-archive: or "
                    "a directory)");
    }
    LocalSourceOptions local_options;
    local_options.architecture = architecture;
    local_options.scratch_directory = target.parent_path();
    const std::unique_ptr<LocalImage> local = open_local_image(uri, local_options);
    write_image_from_layers(local->image, target, options);
}

std::string image_digest(const std::string& uri, const std::string& architecture) {
    if (starts_with(uri, "docker://")) return registry_digest(uri, registry_options(architecture));
    if (is_engine_image_uri(uri)) return inspect_engine_image(uri).id;
    if (!is_local_image_uri(uri)) throw Error("Invalid image reference: " + uri);
    LocalSourceOptions local_options;
    local_options.architecture = architecture;
    return open_local_image(uri, local_options)->image.manifest_digest;
}

void execute_import(const ImportArguments& args) {
    if (args.verbose) {
        const int abi = landlock_abi_version();
        print_error(
            "import: the layers are read by a child process with no_new_privs, no "
            "capabilities, a seccomp filter and " +
            std::to_string(kLayerReaderDataLimitBytes >> 20) + " MiB of memory");
        print_error(abi > 0 ? "landlock: applied (ABI " + std::to_string(abi) +
                                  "): the layer reader can open no file" +
                                  (abi >= 4 ? " and make no TCP connection" : "")
                            : std::string("landlock: not applied (this kernel has no Landlock); "
                                          "the layer reader's seccomp filter still refuses every "
                                          "open by path"));
    }
    std::filesystem::path output =
        args.output.empty() ? std::filesystem::path(default_image_name(args.uri) + ".sqsh")
                            : std::filesystem::path(args.output);
    import_image(args.uri, output, args.architecture, args.compression);
}

}  // namespace sqbox::cli

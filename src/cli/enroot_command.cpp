#include "cli/enroot_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>

#include "cli/enroot_conf.h"
#include "cli/enroot_settings.h"
#include "cli/import_command.h"
#include "config/config_validation.h"
#include "image/container_store.h"
#include "image/environment_file.h"
#include "image/fstab.h"
#include "image/fstab_mounts.h"
#include "image/image_source.h"
#include "import/image_import.h"
#include "runtime/sandbox_user.h"
#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/text.h"

extern char** environ;

namespace sqbox::cli {
namespace {

constexpr const char* kEnrootCompatVersion = "3.5.0";
constexpr size_t kMaxRcBytes = size_t{1024} * 1024;
// How long a --rw start waits for another start that writes the same container (as enroot).
constexpr int kLockWaitSeconds = 30;

// Misuse (exit 1) or an explicit --help (exit 0): the command's usage on stdout, as enroot does.
struct UsageExit {
    std::string command;
    int status;
};

std::string usage_text(const std::string& program, const std::string& command) {
    const std::string& p = program;
    if (command == "create") {
        return "Usage: " + p +
               " create [options] [--] IMAGE\n\n"
               "Create a container from a squashfs image. sqbox does not unpack the image: the\n"
               "container refers to it and keeps its own writable layer.\n\n"
               " Options:\n"
               "   -n, --name   Name of the container (defaults to \"IMAGE\" without .sqsh)\n"
               "   -f, --force  Replace an existing container of that name\n";
    }
    if (command == "start") {
        return "Usage: " + p +
               " start [options] [--] NAME|IMAGE [COMMAND] [ARG...]\n\n"
               "Start a container (or a squashfs image directly) and run its command script,\n"
               "/etc/rc, with COMMAND and ARGs as its arguments. Without a command script the\n"
               "command runs directly; with neither, an interactive shell starts.\n\n"
               " Options:\n"
               "   -c, --conf CONFIG    Configuration script: its environ(), mounts() and rc()\n"
               "   -e, --env KEY[=VAL]  Set an environment variable in the container\n"
               "       --rc SCRIPT      Use SCRIPT instead of the container's command script\n"
               "   -r, --root           Appear as root (uid 0) in the container\n"
               "   -w, --rw             Make the root filesystem writable (a container keeps\n"
               "                        its changes)\n"
               "   -m, --mount FSTAB    Mount a host path: fstab fields separated by colons\n"
               "       --pid, --net, --ipc, --uts\n"
               "                        Accepted; sqbox always gives each sandbox its own\n";
    }
    if (command == "import") {
        return "Usage: " + p +
               " import [options] [--] URI\n\n"
               "Import a container image from a registry or an archive as a squashfs image.\n\n"
               " Schemes:\n"
               "   docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]\n"
               "   dockerd://IMAGE[:TAG]\n"
               "   podman://IMAGE[:TAG]\n"
               "   oci:DIR[:REF], oci-archive:FILE[:REF], docker-archive:FILE[:REF]\n\n"
               " Options:\n"
               "   -a, --arch    Architecture of the image (defaults to host architecture)\n"
               "   -o, --output  Name of the output image file (defaults to \"URI.sqsh\")\n";
    }
    if (command == "load") {
        return "Usage: " + p +
               " load [options] [--] URI\n\n"
               "Import a container image and create a container from it.\n\n"
               " Options:\n"
               "   -a, --arch   Architecture of the image (defaults to host architecture)\n"
               "   -f, --force  Replace an existing container of that name\n"
               "   -n, --name   Name of the container (defaults to \"URI\")\n";
    }
    if (command == "digest") {
        return "Usage: " + p +
               " digest [options] [--] URI\n\n"
               "Print the digest of a container image's manifest.\n\n"
               " Options:\n"
               "   -a, --arch  Architecture of the image (defaults to host architecture)\n";
    }
    if (command == "remove") {
        return "Usage: " + p +
               " remove [options] [--] NAME...\n\n"
               "Delete containers and their writable layers.\n\n"
               " Options:\n"
               "   -f, --force  Do not ask for confirmation\n";
    }
    if (command == "list") {
        return "Usage: " + p +
               " list [options]\n\n"
               "List the containers.\n\n"
               " Options:\n"
               "   -f, --fancy  Show each container's image and the size of its layer\n";
    }
    if (command == "export") {
        return "Usage: " + p +
               " export [options] [--] NAME\n\n"
               "Write a container (its image with its layer on top) to a squashfs image.\n\n"
               " Options:\n"
               "   -o, --output  Image file to write (defaults to \"NAME.sqsh\")\n"
               "   -f, --force   Replace an existing image file\n";
    }
    if (command == "version") return "Usage: " + p + " version\n\nPrint the version.\n";
    return "Usage: " + p +
           " COMMAND [ARG...]\n\n"
           "Run containers from squashfs images (sqbox, enroot-compatible).\n\n"
           " Commands:\n"
           "   create [options] [--] IMAGE\n"
           "   digest [options] [--] URI\n"
           "   export [options] [--] NAME\n"
           "   import [options] [--] URI\n"
           "   list   [options]\n"
           "   load   [options] [--] URI\n"
           "   remove [options] [--] NAME...\n"
           "   start  [options] [--] NAME|IMAGE [COMMAND] [ARG...]\n"
           "   version\n";
}

// One command's options, parsed the way enroot's shell loops do: options come first; "--"
// or the first word that is not an option ends them; an unknown option is misuse.
class OptionParser {
  public:
    explicit OptionParser(std::string command) : command_(std::move(command)) {}

    void value(const std::string& short_name, const std::string& long_name,
               std::function<void(const std::string&)> store) {
        values_.push_back({short_name, long_name, std::move(store)});
    }
    void flag(const std::string& short_name, const std::string& long_name,
              std::function<void()> set) {
        flags_.push_back({short_name, long_name, std::move(set)});
    }

    // Returns the words after the options.
    std::vector<std::string> parse(const std::vector<std::string>& args) const {
        size_t i = 0;
        while (i < args.size()) {
            const std::string& word = args[i];
            if (word == "-h" || word == "--help") throw UsageExit{command_, 0};
            if (word == "--") {
                ++i;
                break;
            }
            if (word.size() < 2 || word[0] != '-') break;
            if (consume(args, i)) continue;
            throw UsageExit{command_, 1};
        }
        return {args.begin() + static_cast<std::ptrdiff_t>(i), args.end()};
    }

  private:
    struct Value {
        std::string short_name, long_name;
        std::function<void(const std::string&)> store;
    };
    struct Flag {
        std::string short_name, long_name;
        std::function<void()> set;
    };

    bool consume(const std::vector<std::string>& args, size_t& i) const {
        const std::string& word = args[i];
        for (const auto& flag : flags_) {
            if (word == flag.short_name || word == flag.long_name) {
                flag.set();
                ++i;
                return true;
            }
        }
        for (const auto& option : values_) {
            if (word == option.short_name || word == option.long_name) {
                if (i + 1 >= args.size() || args[i + 1].empty()) throw UsageExit{command_, 1};
                option.store(args[i + 1]);
                i += 2;
                return true;
            }
            const std::string prefix = option.long_name + "=";
            if (word.rfind(prefix, 0) == 0) {
                if (word.size() == prefix.size()) throw UsageExit{command_, 1};
                option.store(word.substr(prefix.size()));
                ++i;
                return true;
            }
        }
        return false;
    }

    std::string command_;
    std::vector<Value> values_;
    std::vector<Flag> flags_;
};

std::string real_path(const std::string& path) {
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(path, ec);
    if (ec) throw Error("No such file or directory: " + path);
    std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, ec);
    if (ec) throw Error("No such file or directory: " + path);
    return canonical.string();
}

bool is_regular_file(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_squashfs(const std::string& path) {
    if (!is_regular_file(path)) return false;
    try {
        return open_image(path).kind == ImageSource::Kind::kSquashfs;
    } catch (const Error&) {
        return false;
    }
}

std::vector<std::pair<std::string, std::string>> caller_environment() {
    std::vector<std::pair<std::string, std::string>> variables;
    for (char** entry = environ; *entry != nullptr; ++entry) {
        std::string text = *entry;
        size_t equals = text.find('=');
        if (equals != std::string::npos) {
            variables.emplace_back(text.substr(0, equals), text.substr(equals + 1));
        }
    }
    return variables;
}

std::optional<std::string> caller_variable(const std::string& name) {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
}

// enroot's clean-up of environment lines from configuration: leading blanks go, comments and
// malformed lines are dropped, ENROOT_* is reserved, one pair of surrounding quotes is removed.
void add_environment_lines(const std::string& text,
                           std::vector<std::pair<std::string, std::string>>& environment) {
    static const std::regex assignment(R"(^[ \t]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$)");
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(start, end - start);
        start = end + 1;
        std::smatch match;
        if (!std::regex_match(line, match, assignment)) continue;
        std::string key = match[1];
        std::string value = match[2];
        if (key.rfind("ENROOT_", 0) == 0) continue;
        static const std::regex quoted(R"(^["'](.*)["'][ \t]*$)");
        std::smatch inner;
        if (std::regex_match(value, inner, quoted)) value = inner[1];
        environment.emplace_back(std::move(key), std::move(value));
    }
}

std::string read_rc_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw Error("No such file or directory: " + path);
    std::string content(kMaxRcBytes + 1, '\0');
    ssize_t n = read_full(fd.get(), content.data(), content.size());
    if (n < 0) throw system_error("cannot read " + path);
    if (static_cast<size_t>(n) > kMaxRcBytes) {
        throw Error("Invalid argument: " + path + " is too large");
    }
    content.resize(static_cast<size_t>(n));
    return content;
}

int exit_status_of(const RunResult& result) {
    // sqbox's own failures are enroot's (exit 1); the payload's status passes through.
    if (!result.error.empty() && result.exit_status == kExitSqboxFailure) return 1;
    return result.exit_status;
}

// The user's own configuration files in DIR (ENROOT_CONFIG_PATH/environ.d or mounts.d) ending in
// `suffix`, in name order. (The system's, under /etc/enroot, are not read: they hand the host's
// /proc, /sys and /dev to containers.)
std::vector<std::string> user_config_files(const std::string& dir, const std::string& suffix) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() > suffix.size() && name.ends_with(suffix) && entry.is_regular_file(ec)) {
            files.push_back(entry.path().string());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

std::string read_config_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!fd) throw system_error("cannot open " + path);
    return read_all(fd.get(), path);
}

void add_user_config(const EnrootSettings& settings, SandboxConfig& config) {
    for (const auto& file : user_config_files(settings.config_path + "/environ.d", ".env")) {
        add_environment_lines(substitute_braced_variables(read_config_file(file), caller_variable),
                              config.environment);
    }
    for (const auto& file : user_config_files(settings.config_path + "/mounts.d", ".fstab")) {
        for (const auto& entry : parse_fstab(read_config_file(file), file, caller_variable)) {
            if (auto spec = mount_spec_from_fstab(entry, HostSources::kAllowed)) {
                config.mounts.push_back(std::move(*spec));
            }
        }
    }
}

// ---- commands ----

int enroot_create(const std::vector<std::string>& args, EnrootSettings settings) {
    std::string name;
    OptionParser parser("create");
    parser.flag("-f", "--force", [&] { settings.force_override = true; });
    parser.value("-n", "--name", [&](const std::string& v) { name = v; });
    std::vector<std::string> rest = parser.parse(args);
    if (rest.size() != 1) throw UsageExit{"create", 1};
    if (rest[0].empty()) throw Error("Invalid argument");
    const std::string image = real_path(rest[0]);
    if (!is_regular_file(image)) throw Error("No such file or directory: " + image);
    if (!is_squashfs(image)) throw Error("Invalid image format: " + image);
    if (name.empty()) {
        name = std::filesystem::path(image).filename().string();
        if (name.size() > 5 && name.ends_with(".sqsh")) name.resize(name.size() - 5);
    }
    ContainerStore store(settings.data_path);
    store.create(name, image, settings.force_override);
    return 0;
}

int enroot_remove(const std::vector<std::string>& args, EnrootSettings settings) {
    OptionParser parser("remove");
    parser.flag("-f", "--force", [&] { settings.force_override = true; });
    std::vector<std::string> names = parser.parse(args);
    if (names.empty()) throw UsageExit{"remove", 1};
    ContainerStore store(settings.data_path);
    for (const auto& name : names) {
        if (name.empty()) throw Error("Invalid argument");
        ContainerStore::check_name(name);
        const std::string path = store.path() + "/" + name;
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            throw Error("No such file or directory: " + path);
        }
        if (!settings.force_override) {
            std::cerr << "Do you really want to delete " << path << "? [y/N] " << std::flush;
            std::string reply;
            std::getline(std::cin, reply);
            if (reply != "y" && reply != "Y") continue;
        }
        store.remove(name);
    }
    return 0;
}

uint64_t disk_usage(const std::string& path) {
    uint64_t total = 0;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(
             path, std::filesystem::directory_options::skip_permission_denied, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        struct stat st {};
        if (::lstat(it->path().c_str(), &st) == 0) {
            total += static_cast<uint64_t>(st.st_blocks) * 512;
        }
    }
    return total;
}

std::string human_size(uint64_t bytes) {
    const char* units[] = {"B", "K", "M", "G", "T"};
    double value = static_cast<double>(bytes);
    size_t unit = 0;
    while (value >= 1024 && unit + 1 < std::size(units)) {
        value /= 1024;
        ++unit;
    }
    char buffer[32];
    (void)std::snprintf(buffer, sizeof buffer, unit == 0 ? "%.0f%s" : "%.1f%s", value, units[unit]);
    return buffer;
}

int enroot_list(const std::vector<std::string>& args, const EnrootSettings& settings) {
    bool fancy = false;
    OptionParser parser("list");
    parser.flag("-f", "--fancy", [&] { fancy = true; });
    (void)parser.parse(args);  // enroot ignores extra words here
    ContainerStore store(settings.data_path);
    std::vector<std::string> names = store.names();
    if (!fancy) {
        for (const auto& name : names) std::cout << name << "\n";
        return 0;
    }
    std::vector<std::array<std::string, 3>> rows = {{"NAME", "LAYER", "IMAGE"}};
    for (const auto& name : names) {
        std::array<std::string, 3> row = {name, "", ""};
        try {
            if (auto container = store.find(name)) {
                const ContainerInfo& info = container->info();
                row[1] = human_size(
                    disk_usage(info.layer.empty() ? info.directory : info.layer + "/upper"));
                row[2] = info.image.empty() ? "(unpacked root filesystem)" : info.image;
            }
        } catch (const Error& e) {
            row[2] = std::string("(") + e.what() + ")";
        }
        rows.push_back(row);
    }
    size_t widths[2] = {0, 0};
    for (const auto& row : rows) {
        widths[0] = std::max(widths[0], row[0].size());
        widths[1] = std::max(widths[1], row[1].size());
    }
    for (const auto& row : rows) {
        std::cout << row[0] << std::string(widths[0] - row[0].size() + 2, ' ') << row[1]
                  << std::string(widths[1] - row[1].size() + 2, ' ') << row[2] << "\n";
    }
    return 0;
}

int enroot_export(const std::vector<std::string>& args, EnrootSettings settings) {
    std::string output;
    OptionParser parser("export");
    parser.flag("-f", "--force", [&] { settings.force_override = true; });
    parser.value("-o", "--output", [&](const std::string& v) { output = v; });
    std::vector<std::string> rest = parser.parse(args);
    if (rest.size() != 1) throw UsageExit{"export", 1};
    const std::string& name = rest.front();
    if (name.empty()) throw Error("Invalid argument");
    if (name.find('/') != std::string::npos) throw Error("Invalid argument: " + name);
    ContainerStore store(settings.data_path);
    std::optional<HeldContainer> container = store.find(name);
    if (!container) throw Error("No such file or directory: " + store.path() + "/" + name);

    if (output.empty()) output = name + ".sqsh";
    output = real_path(output);
    struct stat st {};
    if (::lstat(output.c_str(), &st) == 0) {
        if (!settings.force_override) throw Error("File already exists: " + output);
        if (::unlink(output.c_str()) != 0) throw system_error("cannot replace " + output);
    }

    SandboxConfig config;
    const ContainerInfo& info = container->info();
    config.image = info.image.empty() ? info.directory : info.image;
    config.persistent_layer = info.layer;
    config.read_only_root = true;
    config.map_root = true;  // the image's own owners read as themselves (all end up root)
    set_caller_identity(config);
    config.export_image_path = output;
    config.command = {"export"};
    ContainerLock lock(*container, false, kLockWaitSeconds);
    std::cerr << "[INFO] Creating squashfs filesystem..." << std::endl;
    return exit_status_of(run_sandbox(config));
}

int enroot_start(const std::vector<std::string>& args, EnrootSettings settings) {
    std::string conf_path;
    std::string rc_path;
    std::vector<std::string> mounts;
    std::vector<std::string> env;
    std::optional<bool> root;
    std::optional<bool> writable;
    OptionParser parser("start");
    parser.value("-c", "--conf", [&](const std::string& v) { conf_path = v; });
    parser.value("-m", "--mount", [&](const std::string& v) { mounts.push_back(v); });
    parser.value("-e", "--env", [&](const std::string& v) { env.push_back(v); });
    parser.value("", "--rc", [&](const std::string& v) { rc_path = v; });
    parser.flag("-r", "--root", [&] { root = true; });
    parser.flag("-w", "--rw", [&] { writable = true; });
    for (const char* isolation : {"--pid", "--net", "--ipc", "--uts"}) {
        parser.flag("", isolation, [] {});
    }
    std::vector<std::string> rest = parser.parse(args);
    if (rest.empty()) throw UsageExit{"start", 1};
    const std::string target = rest.front();
    const std::vector<std::string> command(rest.begin() + 1, rest.end());

    std::optional<EnrootConf> conf;
    if (!conf_path.empty()) {
        conf = read_enroot_conf(real_path(conf_path));
        settings.apply(conf->directives);
    }
    if (root) settings.remap_root = true;
    if (writable) settings.rootfs_writable = true;

    SandboxConfig config;
    std::optional<HeldContainer> container;
    if (target.empty()) throw Error("Invalid argument");
    if (is_squashfs(target)) {
        config.image = real_path(target);
    } else {
        if (target.find('/') != std::string::npos) throw Error("Invalid argument: " + target);
        ContainerStore store(settings.data_path);
        container = store.find(target);
        if (!container) throw Error("No such file or directory: " + store.path() + "/" + target);
        const ContainerInfo& info = container->info();
        config.image = info.image.empty() ? info.directory : info.image;
        config.persistent_layer = info.layer;
    }

    // Checked before anything runs; they come after the configuration's own.
    std::vector<MountSpec> option_mounts;
    for (const auto& mount : mounts) {
        if (auto spec = enroot_mount_option(mount)) option_mounts.push_back(std::move(*spec));
    }
    std::vector<std::pair<std::string, std::string>> option_environment;
    option_environment.reserve(env.size());
    for (const auto& variable : env) option_environment.push_back(enroot_env_option(variable));
    std::string rc_script;
    const bool has_rc_file = !rc_path.empty();
    if (has_rc_file) rc_script = read_rc_file(rc_path);

    config.command = command;
    config.entrypoint = SandboxConfig::Entrypoint::kEnrootRc;
    config.login_shell = settings.login_shell;
    config.map_root = settings.remap_root;
    config.read_only_root = !settings.rootfs_writable;
    config.output_limit_bytes = settings.output_limit;
    config.tmpfs_size_bytes = settings.writable_bytes;
    config.image_server_idle_seconds = settings.image_server_idle_seconds;
    set_caller_identity(config);
    config.substitution_environment = caller_environment();
    // enroot's login starts in HOME; sqbox's HOME for root is /root, for others /tmp.
    config.workdir = config.map_root ? "/root" : "/";
    config.workdir_optional = true;
    // enroot's shipped environ.d passes the terminal type through.
    if (auto term = caller_variable("TERM")) config.environment.emplace_back("TERM", *term);

    add_user_config(settings, config);
    if (conf) {
        EnrootConfOutput output =
            evaluate_enroot_conf(*conf, config, command, *config.substitution_environment);
        add_environment_lines(output.environ, config.environment);
        for (const auto& entry :
             parse_fstab(output.mounts, conf->path + " mounts()", caller_variable)) {
            if (auto spec = mount_spec_from_fstab(entry, HostSources::kAllowed)) {
                config.mounts.push_back(std::move(*spec));
            }
        }
        if (output.rc) config.rc_script = *output.rc;
    }
    config.mounts.insert(config.mounts.end(), option_mounts.begin(), option_mounts.end());
    config.environment.insert(config.environment.end(), option_environment.begin(),
                              option_environment.end());
    if (has_rc_file) config.rc_script = rc_script;

    std::optional<ContainerLock> lock;
    if (container && !container->info().layer.empty()) {
        lock.emplace(*container, settings.rootfs_writable, kLockWaitSeconds);
    }
    return exit_status_of(run_sandbox(config));
}

int enroot_import(const std::vector<std::string>& args) {
    std::string architecture;
    std::string output;
    OptionParser parser("import");
    parser.value("-a", "--arch", [&](const std::string& v) { architecture = v; });
    parser.value("-o", "--output", [&](const std::string& v) { output = v; });
    std::vector<std::string> rest = parser.parse(args);
    if (rest.size() != 1) throw UsageExit{"import", 1};
    if (output.empty()) output = default_image_name(rest[0]) + ".sqsh";
    import_image(rest[0], output, architecture, "zstd");
    return 0;
}

// enroot load: import, then create. The image stays in DATA/.sqbox-images/ for the container,
// which refers to it rather than unpacking it.
int enroot_load(const std::vector<std::string>& args, EnrootSettings settings) {
    std::string architecture;
    std::string name;
    OptionParser parser("load");
    parser.value("-a", "--arch", [&](const std::string& v) { architecture = v; });
    parser.value("-n", "--name", [&](const std::string& v) { name = v; });
    parser.flag("-f", "--force", [&] { settings.force_override = true; });
    std::vector<std::string> rest = parser.parse(args);
    if (rest.size() != 1) throw UsageExit{"load", 1};
    if (name.empty()) name = default_image_name(rest[0]);
    ContainerStore::check_name(name);
    ContainerStore store(settings.data_path);
    if (!settings.force_override && store.find(name)) {
        throw Error("File already exists: " + settings.data_path + "/" + name);
    }
    const std::filesystem::path images =
        std::filesystem::path(settings.data_path) / ".sqbox-images";
    make_directories(images.string(), 0700);
    const std::filesystem::path image = temporary_path_beside(images / (name + ".sqsh"));
    import_image(rest[0], image, architecture, "zstd");
    try {
        store.create(name, image.string(), settings.force_override);
    } catch (...) {
        (void)::unlink(image.c_str());  // the create's own error is the one to report
        throw;
    }
    return 0;
}

int enroot_digest(const std::vector<std::string>& args) {
    std::string architecture;
    OptionParser parser("digest");
    parser.value("-a", "--arch", [&](const std::string& v) { architecture = v; });
    std::vector<std::string> rest = parser.parse(args);
    if (rest.size() != 1) throw UsageExit{"digest", 1};
    std::cout << image_digest(rest[0], architecture) << "\n";
    return 0;
}

int enroot_version(const std::vector<std::string>& args) {
    OptionParser parser("version");
    (void)parser.parse(args);
    std::cout << kEnrootCompatVersion << "\n";
    return 0;
}

int dispatch(const std::vector<std::string>& args, const EnrootSettings& settings) {
    const std::string& command = args.front();
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "create") return enroot_create(rest, settings);
    if (command == "start") return enroot_start(rest, settings);
    if (command == "remove") return enroot_remove(rest, settings);
    if (command == "list") return enroot_list(rest, settings);
    if (command == "export") return enroot_export(rest, settings);
    if (command == "version") return enroot_version(rest);
    if (command == "import") return enroot_import(rest);
    if (command == "load") return enroot_load(rest, settings);
    if (command == "digest") return enroot_digest(rest);
    if (command == "help") throw UsageExit{"help", 0};
    if (command == "bundle" || command == "batch" || command == "exec" || command == "info") {
        throw Error("the " + command + " command is not supported by sqbox");
    }
    throw UsageExit{"help", 1};
}

}  // namespace

std::optional<MountSpec> enroot_mount_option(const std::string& argument) {
    return mount_spec_from_fstab(parse_mount_argument(argument), HostSources::kAllowed);
}

std::pair<std::string, std::string> enroot_env_option(const std::string& argument) {
    std::pair<std::string, std::optional<std::string>> assignment;
    try {
        assignment = validate::variable_assignment(argument, "--env " + argument);
    } catch (const Error&) {
        throw Error("Invalid argument: " + argument);  // enroot's own words for it
    }
    auto& [name, value] = assignment;
    if (!value) value = caller_variable(name).value_or("");
    return {std::move(name), std::move(*value)};
}

int enroot_main(const std::string& program, const std::vector<std::string>& args) {
    try {
        if (args.empty()) throw UsageExit{"help", 1};
        return dispatch(args, load_enroot_settings());
    } catch (const UsageExit& usage) {
        std::cout << usage_text(program, usage.command) << std::flush;
        return usage.status;
    } catch (const Error& e) {
        std::cerr << "[ERROR] " << blank_controls(e.what()) << std::endl;
        return 1;
    }
}

}  // namespace sqbox::cli

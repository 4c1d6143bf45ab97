#include "cli/enroot_conf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include "sqbox/sandbox.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox::cli {
namespace {

// The script travels as one argument of `sh -c` (the kernel's limit per argument is 128 KiB).
constexpr size_t kMaxConfBytes = size_t{96} * 1024;
constexpr const char* kSectionMark = "\x1esqbox-conf:";

bool defines_function(const std::string& text, const std::string& name) {
    const std::regex definition("(^|\\n)[ \\t]*(function[ \\t]+" + name + "\\b|" + name +
                                "[ \\t]*\\([ \\t]*\\))");
    return std::regex_search(text, definition);
}

// Prints each defined function's output after a marker line. rc() is printed as its body, which
// only bash can do (declare -f); enroot's scripts are bash scripts.
std::string evaluation_script(const EnrootConf& conf) {
    std::string script = conf.text;
    script += "\n__sqbox_section() { printf '\\n";
    script += kSectionMark;
    script += "%s\\n' \"$1\"; }\n";
    if (conf.has_environ) script += "__sqbox_section environ; environ\n";
    if (conf.has_mounts) script += "__sqbox_section mounts; mounts\n";
    if (conf.has_rc) script += "__sqbox_section rc; declare -f rc\n";
    return script;
}

// Splits the evaluation's output at the section markers.
std::map<std::string, std::string> split_sections(const std::string& output) {
    std::map<std::string, std::string> sections;
    const std::string mark = std::string("\n") + kSectionMark;
    size_t at = output.find(mark);
    while (at != std::string::npos) {
        size_t name_start = at + mark.size();
        size_t name_end = output.find('\n', name_start);
        if (name_end == std::string::npos) break;
        size_t next = output.find(mark, name_end);
        sections[output.substr(name_start, name_end - name_start)] = output.substr(
            name_end + 1, next == std::string::npos ? std::string::npos : next - name_end - 1);
        at = next;
    }
    return sections;
}

// `declare -f rc` prints "rc ()", "{", the body, "}": keep the body.
std::string function_body(const std::string& declaration) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < declaration.size()) {
        size_t end = declaration.find('\n', start);
        if (end == std::string::npos) end = declaration.size();
        lines.push_back(declaration.substr(start, end - start));
        start = end + 1;
    }
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    if (lines.size() < 3) throw Error("cannot read the rc() function of the configuration");
    std::string body;
    for (size_t i = 2; i + 1 < lines.size(); ++i) body += lines[i] + "\n";
    return body;
}

}  // namespace

EnrootConf read_enroot_conf(const std::string& path) {
    EnrootConf conf;
    conf.path = path;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw Error("No such file or directory: " + path);
    }
    if (static_cast<size_t>(st.st_size) > kMaxConfBytes) {
        throw Error("Invalid argument: " + path + " is larger than " +
                    std::to_string(kMaxConfBytes / 1024) + " KiB");
    }
    conf.text = read_all(fd.get(), path);
    if (defines_function(conf.text, "hooks")) {
        throw Error(path +
                    " defines hooks(): sqbox does not run host code for a container "
                    "(use mounts() and environ(), which are evaluated inside the sandbox)");
    }
    conf.has_environ = defines_function(conf.text, "environ");
    conf.has_mounts = defines_function(conf.text, "mounts");
    conf.has_rc = defines_function(conf.text, "rc");

    static const std::regex directive(
        R"(^#[ \t]*(ENROOT_[A-Z_]+)[ \t=]+["']?([^"' \t]*)["']?[ \t]*$)");
    size_t start = 0;
    while (start < conf.text.size()) {
        size_t end = conf.text.find('\n', start);
        if (end == std::string::npos) end = conf.text.size();
        std::smatch match;
        const std::string line = conf.text.substr(start, end - start);
        if (std::regex_match(line, match, directive)) conf.directives[match[1]] = match[2];
        start = end + 1;
    }
    return conf;
}

EnrootConfOutput evaluate_enroot_conf(
    const EnrootConf& conf, const SandboxConfig& base, const std::vector<std::string>& arguments,
    const std::vector<std::pair<std::string, std::string>>& caller_environment) {
    EnrootConfOutput output;
    if (!conf.has_environ && !conf.has_mounts && !conf.has_rc) return output;

    // Not the container's image: its shell is the image's code, and what the functions print
    // becomes mounts of host paths. The host's own root, read-only, in a throw-away sandbox:
    // the functions see what they would see under enroot (your files, your environment) and
    // can change none of it.
    SandboxConfig config = base;
    config.image = "/";
    config.persistent_layer.clear();
    config.image_fstab = false;
    config.mounts.clear();
    config.map_root = false;
    config.read_only_root = true;
    config.entrypoint = SandboxConfig::Entrypoint::kCommand;
    config.timeout_seconds = 30;
    std::error_code ec;
    config.workdir = std::filesystem::current_path(ec).string();
    if (ec) config.workdir = "/";
    config.workdir_optional = true;
    // The functions see what enroot's would: the caller's environment and the command.
    config.environment = caller_environment;
    config.environment.emplace_back("SQBOX_CONF_SCRIPT", evaluation_script(conf));
    const std::string shell = ::access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
    config.command = {shell, "-c", "eval \"$SQBOX_CONF_SCRIPT\"", conf.path};
    config.command.insert(config.command.end(), arguments.begin(), arguments.end());

    // Capture the sandbox's stdout in a memory file (a pipe could fill up while we wait).
    UniqueFd capture(::memfd_create("sqbox-conf-output", MFD_CLOEXEC));
    UniqueFd saved_stdout(::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3));
    if (!capture || !saved_stdout) throw system_error("cannot capture the configuration's output");
    if (::dup2(capture.get(), STDOUT_FILENO) < 0) throw system_error("dup2");
    RunResult result = run_sandbox(config);
    if (::dup2(saved_stdout.get(), STDOUT_FILENO) < 0) throw system_error("dup2");
    if (result.exit_status != 0) {
        throw Error("the configuration " + conf.path + " failed (exit status " +
                    std::to_string(result.exit_status) + ")");
    }
    if (::lseek(capture.get(), 0, SEEK_SET) != 0) throw system_error("lseek");
    auto sections = split_sections(read_all(capture.get(), "the configuration's output"));
    output.environ = sections["environ"];
    output.mounts = sections["mounts"];
    if (conf.has_rc) {
        auto rc = sections.find("rc");
        if (rc == sections.end() || rc->second.empty()) {
            throw Error(conf.path + ": rc() needs bash in the image");
        }
        output.rc = function_body(rc->second);
    }
    return output;
}

}  // namespace sqbox::cli

#include "runtime/look_ahead.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "image/program_interpreter.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// What is read of each file: one FUSE read's worth.
constexpr size_t kFirstChunkBytes = size_t{128} << 10;

// Interpreters followed (a program's loader, a script's shell, that shell's loader): bounded, so
// that a chain of scripts cannot keep the look-ahead going.
constexpr size_t kMaxInterpreters = 4;

// Opens `path` as the sandbox would resolve it, on the image mounted at `root`: absolute symlinks
// and ".." stay inside the image, never across a mount, never through a /proc magic link.
UniqueFd open_in_image(int root, const std::string& path, uint64_t flags) {
    open_how how{};
    how.flags = flags;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS;
    return UniqueFd(static_cast<int>(::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how)));
}

void look_ahead(const std::string& mount_point, std::vector<std::string> paths) {
    UniqueFd root(::open(mount_point.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) return;
    const size_t limit = paths.size() + kMaxInterpreters;
    // Failures (missing names included) are the point or harmless.
    for (size_t i = 0; i < paths.size(); ++i) {
        // O_NONBLOCK: a FIFO does not block the open.
        UniqueFd file =
            open_in_image(root.get(), paths[i], O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        struct stat info {};
        if (!file || ::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
        if ((info.st_mode & 0111) != 0 && paths.size() < limit) {
            std::string head(kProgramHeadBytes, '\0');
            const ssize_t got = ::pread(file.get(), head.data(), head.size(), 0);
            head.resize(got > 0 ? static_cast<size_t>(got) : 0);
            if (std::optional<std::string> interpreter = program_interpreter(head)) {
                paths.push_back(std::move(*interpreter));
            }
        }
        (void)::readahead(file.get(), 0, kFirstChunkBytes);
    }
}

}  // namespace

std::vector<std::string> first_lookups(const SandboxConfig& config,
                                       const std::string& default_path) {
    std::vector<std::string> paths = {"/etc/hostname", "/etc/hosts",       "/etc/resolv.conf",
                                      "/etc/fstab",    "/etc/environment", "/etc/passwd",
                                      "/etc/group"};
    if (config.entrypoint == SandboxConfig::Entrypoint::kEnrootRc) paths.emplace_back("/etc/rc");
    if (config.command.empty()) return paths;
    const std::string& program = config.command.front();
    if (program.starts_with('/')) {
        paths.push_back(program);
    } else if (program.find('/') == std::string::npos) {
        // The PATH the payload searches: the default unless --env sets one (the image's
        // /etc/environment may too, but it is not read yet; this is only a hint).
        std::string search = default_path;
        for (const auto& [key, value] : config.environment) {
            if (key == "PATH") search = value;
        }
        size_t start = 0;
        while (start <= search.size()) {
            size_t end = search.find(':', start);
            if (end == std::string::npos) end = search.size();
            const std::string dir = search.substr(start, end - start);
            if (dir.starts_with('/')) paths.push_back(dir + "/" + program);
            start = end + 1;
        }
    }
    // What glibc's dynamic loader reads first in any dynamically linked program.
    paths.insert(paths.end(), {"/etc/ld.so.preload", "/etc/ld.so.cache"});
    return paths;
}

void start_look_ahead(std::string mount_point, std::vector<std::string> paths) {
    try {
        std::thread([mount_point = std::move(mount_point), paths = std::move(paths)]() mutable {
            look_ahead(mount_point, std::move(paths));
        }).detach();
    } catch (const std::system_error&) {
        // No thread to be had: the sandbox only starts a little slower.
    }
}

}  // namespace sqbox

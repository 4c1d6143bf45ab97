#include "runtime/rooted_path.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

std::vector<std::string> path_components(const std::string& path, const std::string& what) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= path.size()) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        std::string part = path.substr(start, slash - start);
        if (part == "..") throw Error(what + ": path " + path + " must not contain '..'");
        if (!part.empty() && part != ".") parts.push_back(std::move(part));
        start = slash + 1;
    }
    return parts;
}

namespace {

UniqueFd open_component(int dir_fd, const std::string& name) {
    return UniqueFd(::openat(dir_fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
}

}  // namespace

UniqueFd resolve_in_root(int root_fd, const std::string& path, EntryKind last_kind, bool create,
                         const std::string& what) {
    std::vector<std::string> parts = path_components(path, what);
    UniqueFd current(::openat(root_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!current) throw system_error(what + ": cannot open the sandbox root");

    std::string walked;
    for (size_t i = 0; i < parts.size(); ++i) {
        const std::string& name = parts[i];
        walked += "/" + name;
        const bool last = i + 1 == parts.size();
        const bool want_dir = !last || last_kind == EntryKind::kDirectory;
        const bool any_kind = last && last_kind == EntryKind::kAny;

        UniqueFd next = open_component(current.get(), name);
        if (!next && errno == ENOENT && create && !any_kind) {
            int rc = 0;
            if (want_dir) {
                rc = ::mkdirat(current.get(), name.c_str(), 0755);
            } else {
                rc = ::openat(current.get(), name.c_str(),
                              O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
                if (rc >= 0) (void)::close(rc);
            }
            if (rc < 0 && errno != EEXIST) {
                throw system_error(what + ": cannot create " + walked + " in the sandbox");
            }
            next = open_component(current.get(), name);
        }
        if (!next) throw system_error(what + ": " + walked);

        struct stat st {};
        if (::fstat(next.get(), &st) != 0) throw system_error(what + ": cannot stat " + walked);
        if (S_ISLNK(st.st_mode)) {
            throw Error(what + ": " + walked +
                        " is a symlink in the sandbox; refusing to follow it");
        }
        if (any_kind) {
            // the caller takes whatever is there
        } else if (want_dir && !S_ISDIR(st.st_mode)) {
            throw Error(what + ": " + walked + " is not a directory in the sandbox");
        } else if (!want_dir && S_ISDIR(st.st_mode)) {
            throw Error(what + ": " + walked + " is a directory in the sandbox");
        }
        current = std::move(next);
    }
    return current;
}

std::string read_image_file(int root_fd, const char* relative_path, size_t max_bytes,
                            const std::string& what) {
    open_how how{};
    how.flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, root_fd, relative_path, &how, sizeof how)));
    if (!fd) {
        if (errno == ENOENT || errno == ENOTDIR) return {};
        throw system_error("cannot open " + what);
    }
    return read_bounded_regular_file(fd.get(), max_bytes, what);
}

}  // namespace sqbox

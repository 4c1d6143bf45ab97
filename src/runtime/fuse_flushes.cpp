// Stopping FLUSH on a FUSE connection whose server opens files with no message
// (runtime/fuse_flushes.h).
#include "runtime/fuse_flushes.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <memory>
#include <string>

#include "runtime/stage_report.h"
#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

// How far stop_fuse_flushes looks for a file: directories listed, entries looked at.
constexpr int kFlushStopDirectories = 64;
constexpr int kFlushStopEntries = 4096;

// Opens and closes `name` in `dir` if it is a regular file; true if it was one.
bool open_and_close_file(int dir, const char* name) {
    UniqueFd file(::openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!file) {
        if (is_lost_image_server(errno)) throw system_error("the image server is gone");
        return false;  // unreadable (a corrupt inode, say): another will do
    }
    struct stat st {};
    if (::fstat(file.get(), &st) != 0) throw system_error("cannot stat a file of the image");
    if (!S_ISREG(st.st_mode)) return false;  // closing anything else sends no FLUSH
    // The FLUSH is sent, and refused, here: close reports its failure.
    if (::close(file.release()) != 0) throw system_error("cannot close a file of the image");
    return true;
}

// The directory `path` beneath `root`, through no symlink; none if it cannot be opened.
UniqueFd open_directory_beneath(int root, const std::string& path) {
    open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV;
    UniqueFd dir(static_cast<int>(::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how)));
    if (!dir && is_lost_image_server(errno)) throw system_error("the image server is gone");
    return dir;
}

}  // namespace

void stop_fuse_flushes(const std::string& image_dir) {
    const UniqueFd root(::open(image_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) throw system_error("cannot open " + image_dir);
    // Nearly every image has /etc/passwd: two lookups that the sandbox's set-up makes anyway,
    // where a walk lists directories (on a first run, read from the disk).
    const UniqueFd etc = open_directory_beneath(root.get(), "etc");
    if (etc && open_and_close_file(etc.get(), "passwd")) return;
    std::deque<std::string> directories{"."};
    int listed = 0;
    int entries = 0;
    while (!directories.empty() && listed < kFlushStopDirectories) {
        UniqueFd dir = open_directory_beneath(root.get(), directories.front());
        const std::string path = std::move(directories.front());
        directories.pop_front();
        if (!dir) continue;
        ++listed;
        const int dir_fd = dir.get();
        std::unique_ptr<DIR, int (*)(DIR*)> listing(::fdopendir(dir_fd), ::closedir);
        if (!listing) throw system_error("cannot list " + path + " of the image");
        (void)dir.release();  // the listing's now
        for (;;) {
            errno = 0;
            const dirent* entry = ::readdir(listing.get());
            if (entry == nullptr) {
                if (is_lost_image_server(errno)) throw system_error("the image server is gone");
                break;
            }
            const std::string name = entry->d_name;
            if (name == "." || name == "..") continue;
            if (++entries > kFlushStopEntries) break;
            if (entry->d_type == DT_REG && open_and_close_file(dir_fd, name.c_str())) return;
            if (entry->d_type == DT_DIR) directories.push_back(path + "/" + name);
        }
        if (entries > kFlushStopEntries) break;
    }
    throw Error("found no regular file near the image's root to open first");
}

}  // namespace sqbox

// Export on what a hostile image holds: its entries (names, modes, symlink targets, contents, as
// the container's root shows them) laid out on disk, packed by squashfs_writer into a new image,
// which must hold the same.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_targets.h"
#include "image/squashfs_guards.h"
#include "image/squashfs_writer.h"
#include "util/errors.h"
#include "util/file_tree.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox::fuzz {
namespace {

constexpr size_t kMaxEntries = 200;
constexpr uint64_t kMaxFileBytes = uint64_t{64} << 10;

// What an entry is, as far as export must keep it. Setuid and setgid bits are left out: what
// export does with them is export's policy, not a matter of reading the tree right.
constexpr mode_t kKeptBits = S_IFMT | 01777;
struct Entry {
    mode_t mode = 0;      // type and permission bits
    std::string content;  // a regular file's bytes, a symlink's target
    bool operator==(const Entry&) const = default;
};
using Tree = std::map<std::string, Entry>;  // by path below the top ("/a/b")

std::optional<std::string> file_content(sqfs* fs, sqfs_inode& inode) {
    std::string content(static_cast<size_t>(inode.xtra.reg.file_size), '\0');
    auto length = static_cast<sqfs_off_t>(content.size());
    if (checked_read_range(fs, &inode, 0, &length, content.data()) != SQFS_OK ||
        length != static_cast<sqfs_off_t>(content.size())) {
        return std::nullopt;
    }
    return content;
}

std::optional<std::string> link_target(sqfs* fs, sqfs_inode& inode) {
    size_t size = 0;
    if (sqfs_readlink(fs, &inode, nullptr, &size) != SQFS_OK || size >= 4096) return std::nullopt;
    std::string target(size + 1, '\0');
    size = target.size();
    if (sqfs_readlink(fs, &inode, target.data(), &size) != SQFS_OK) return std::nullopt;
    target.resize(target.find('\0'));
    if (target.empty()) return std::nullopt;
    return target;
}

// The image's entries as files below `top` (names the kernel would refuse are left out, as are
// entries the image cannot give), with the modes the writer must keep. Returns what was made.
Tree lay_out(sqfs* fs, const std::string& top) {
    Tree made;
    std::vector<std::pair<std::string, mode_t>> directories;  // permission bits, set last
    walk_image(fs, kMaxEntries, [&](const std::string& path, sqfs_inode& inode) {
        if (path == "/") return;
        const std::string name = path.substr(path.rfind('/') + 1);
        const std::string parent = path.substr(0, path.rfind('/'));
        if (name.empty() || name == "." || name == ".." || path.size() > 1024 ||
            made.count(path) != 0 || (!parent.empty() && made.count(parent) == 0)) {
            return;
        }
        const std::string where = top + path;
        // Readable and searchable by the writer whoever runs this.
        const mode_t permissions = inode.base.mode & 07777;
        Entry entry{static_cast<mode_t>(inode.base.mode & S_IFMT), {}};
        if (S_ISDIR(inode.base.mode)) {
            if (::mkdir(where.c_str(), 0700) != 0) return;
            entry.mode |= permissions | 0700;
            directories.emplace_back(where, entry.mode & 07777);
        } else if (S_ISREG(inode.base.mode)) {
            if (inode.xtra.reg.file_size > kMaxFileBytes) return;
            std::optional<std::string> content = file_content(fs, inode);
            if (!content) return;
            entry.mode |= permissions | 0400;
            entry.content = std::move(*content);
            // Names the host refuses (longer than 255 bytes) are left out.
            UniqueFd file(::open(where.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
            if (!file) return;
            if (!write_all(file.get(), entry.content.data(), entry.content.size()) ||
                ::fchmod(file.get(), entry.mode & 07777) != 0) {
                std::abort();
            }
        } else if (S_ISLNK(inode.base.mode)) {
            std::optional<std::string> target = link_target(fs, inode);
            if (!target || ::symlink(target->c_str(), where.c_str()) != 0) return;
            entry.mode |= 0777;
            entry.content = std::move(*target);
        } else if (S_ISFIFO(inode.base.mode)) {
            if (::mkfifo(where.c_str(), 0600) != 0) return;
            if (::chmod(where.c_str(), permissions) != 0) std::abort();
            entry.mode |= permissions;
        } else {
            return;  // devices and sockets need privileges to make
        }
        entry.mode &= kKeptBits;
        made[path] = std::move(entry);
    });
    for (auto it = directories.rbegin(); it != directories.rend(); ++it) {
        if (::chmod(it->first.c_str(), it->second) != 0) std::abort();
    }
    return made;
}

// What the image written by export holds, read back with libsquashfuse.
Tree read_back(sqfs* fs) {
    Tree found;
    walk_image(fs, kMaxEntries * 2, [&](const std::string& path, sqfs_inode& inode) {
        if (path == "/") return;
        Entry entry{static_cast<mode_t>(inode.base.mode & kKeptBits), {}};
        if (S_ISREG(inode.base.mode)) {
            entry.content = file_content(fs, inode).value_or("unreadable");
        } else if (S_ISLNK(inode.base.mode)) {
            entry.content = link_target(fs, inode).value_or("unreadable");
            entry.mode = S_IFLNK | 0777;
        }
        found[path] = std::move(entry);
    });
    return found;
}

}  // namespace

void image_export(const uint8_t* data, size_t size) {
    std::optional<ImageSource> image = open_fuzz_image(data, size);
    if (!image) return;
    static std::atomic<unsigned> counter{0};
    const std::string work = scratch_directory() + "/export-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++);
    const std::string top = work + "/tree";
    if (::mkdir(work.c_str(), 0700) != 0 || ::mkdir(top.c_str(), 0755) != 0) std::abort();
    const Tree made = lay_out(&image->squashfs->fs, top);
    const std::string output = work + "/exported.sqsh";
    {
        UniqueFd top_fd(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!top_fd) std::abort();
        // Anything the tree holds is what a container's root may hold: export must take it.
        write_squashfs_image(top_fd.get(), output, {});
    }
    std::optional<ImageSource> exported;
    try {
        exported = open_image(output);
    } catch (const Error&) {
        std::abort();  // export wrote an image sqbox cannot open
    }
    if (read_back(&exported->squashfs->fs) != made) std::abort();
    remove_tree(work);
}

}  // namespace sqbox::fuzz

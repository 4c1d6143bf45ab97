#include "fuzz_image.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "image/squashfs_guards.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox::fuzz {

std::optional<ImageSource> open_fuzz_image(const uint8_t* data, size_t size) {
    UniqueFd memory(::memfd_create("sqbox-fuzz-image", MFD_CLOEXEC));
    if (!memory || !write_all(memory.get(), data, size)) std::abort();
    try {
        // Through /proc, as a path: open_image opens and validates it as it would a user's file.
        return open_image("/proc/self/fd/" + std::to_string(memory.get()));
    } catch (const Error&) {
        return std::nullopt;
    }
}

void walk_image(sqfs* fs, size_t max_entries,
                const std::function<void(const std::string& path, sqfs_inode& inode)>& visit) {
    sqfs_inode root;
    if (checked_root_inode(fs, &root) != SQFS_OK) return;
    visit("/", root);
    std::vector<std::pair<std::string, sqfs_inode>> pending = {{"", root}};
    size_t entries = 0;
    while (!pending.empty() && entries < max_entries) {
        auto [path, directory] = pending.back();
        pending.pop_back();
        if (!S_ISDIR(directory.base.mode)) continue;
        sqfs_dir dir;
        if (sqfs_dir_open(fs, &directory, &dir, 0) != SQFS_OK) continue;
        DirEntryBuffer entry;
        sqfs_err err = SQFS_OK;
        while (entries < max_entries && sqfs_dir_next(fs, &dir, entry.get(), &err) &&
               entry.name_ok()) {
            ++entries;
            sqfs_inode inode;
            if (checked_inode_get(fs, &inode, sqfs_dentry_inode(entry.get())) != SQFS_OK) continue;
            const std::string name = sqfs_dentry_name(entry.get());
            // Names the kernel refuses from a FUSE server: never seen by anything above it.
            if (name.empty() || name == "." || name == ".." ||
                name.find('/') != std::string::npos) {
                continue;
            }
            const std::string child = path + "/" + name;
            visit(child, inode);
            if (S_ISDIR(inode.base.mode)) pending.emplace_back(child, inode);
        }
    }
}

const std::string& scratch_directory() {
    static const std::string directory = [] {
        const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        std::string pattern = std::string(base) + "/sqbox-fuzz-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) std::abort();
        // Each input removes what it made; a crash leaves its files for a look.
        (void)std::atexit([] { (void)::rmdir(scratch_directory().c_str()); });
        return pattern;
    }();
    return directory;
}

}  // namespace sqbox::fuzz

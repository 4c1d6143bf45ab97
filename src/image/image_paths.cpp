#include "image/image_paths.h"

#include <sys/stat.h>

#include <deque>
#include <string_view>

#include "image/squashfs_guards.h"

namespace sqbox {
namespace {

// As the kernel's limits: symlinks followed in one lookup, the length of a path and of a symlink's
// target.
constexpr int kMaxSymlinks = 40;
constexpr size_t kMaxPathBytes = 4096;

// Puts the components of `path` in front of `pending`, in order.
void push_components_front(std::deque<std::string>& pending, std::string_view path) {
    std::deque<std::string> components;
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string_view::npos) end = path.size();
        if (end > start) components.emplace_back(path.substr(start, end - start));
        start = end + 1;
    }
    pending.insert(pending.begin(), components.begin(), components.end());
}

std::optional<std::string> read_symlink(sqfs* fs, sqfs_inode* inode) {
    size_t size = 0;
    // The size comes from the image: bounded before anything is allocated for it.
    if (sqfs_readlink(fs, inode, nullptr, &size) != SQFS_OK || size >= kMaxPathBytes) {
        return std::nullopt;
    }
    std::string target(size + 1, '\0');
    size = target.size();
    if (sqfs_readlink(fs, inode, target.data(), &size) != SQFS_OK) return std::nullopt;
    target.resize(target.find('\0'));
    return target;
}

}  // namespace

std::optional<std::vector<ImagePathStep>> resolve_image_path(sqfs* fs, const std::string& path,
                                                             size_t* lookups_left) {
    sqfs_inode root;
    if (checked_root_inode(fs, &root) != SQFS_OK) return std::nullopt;
    std::vector<ImagePathStep> steps;
    std::deque<std::string> pending;
    push_components_front(pending, path);
    int symlinks = 0;
    size_t path_bytes = 0;  // of the steps so far, with their slashes
    DirEntryBuffer entry;
    while (!pending.empty()) {
        const std::string name = std::move(pending.front());
        pending.pop_front();
        if (name == ".") continue;
        if (name == "..") {
            if (!steps.empty()) {
                path_bytes -= steps.back().name.size() + 1;
                steps.pop_back();
            }
            continue;
        }
        if (lookups_left != nullptr) {
            if (*lookups_left == 0) return std::nullopt;
            --*lookups_left;
        }
        sqfs_inode* directory = steps.empty() ? &root : &steps.back().inode;
        if (!S_ISDIR(directory->base.mode)) return std::nullopt;
        bool found = false;
        if (sqfs_dir_lookup(fs, directory, name.data(), name.size(), entry.get(), &found) !=
                SQFS_OK ||
            !entry.name_ok() || !found) {
            return std::nullopt;
        }
        ImagePathStep step{name, {}};
        if (checked_inode_get(fs, &step.inode, sqfs_dentry_inode(entry.get())) != SQFS_OK) {
            return std::nullopt;
        }
        if (S_ISLNK(step.inode.base.mode)) {
            if (++symlinks > kMaxSymlinks) return std::nullopt;
            std::optional<std::string> target = read_symlink(fs, &step.inode);
            if (!target || target->empty()) return std::nullopt;
            if (target->front() == '/') {
                steps.clear();
                path_bytes = 0;
            }
            push_components_front(pending, *target);
            continue;
        }
        path_bytes += step.name.size() + 1;
        if (path_bytes > kMaxPathBytes) return std::nullopt;
        steps.push_back(std::move(step));
    }
    return steps;
}

std::string image_path_of(const std::vector<ImagePathStep>& steps) {
    if (steps.empty()) return "/";
    std::string path;
    for (const auto& step : steps) path += "/" + step.name;
    return path;
}

}  // namespace sqbox

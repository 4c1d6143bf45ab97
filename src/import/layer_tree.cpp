#include "import/layer_tree.h"

#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>

#include "util/errors.h"

namespace sqbox {
namespace {

constexpr int kMaxSymlinkHops = 40;  // as the kernel's path walk
constexpr std::string_view kWhiteoutPrefix = ".wh.";
constexpr std::string_view kOpaqueMarker = ".wh..wh..opq";
constexpr size_t kMaxNameBytes = 255;

std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> components;
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        std::string component = path.substr(start, end - start);
        if (!component.empty() && component != ".") components.push_back(std::move(component));
        start = end + 1;
    }
    return components;
}

bool starts_with(const std::string& text, std::string_view prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

// An entry's path as components, or an Error for one that climbs out with "..".
std::vector<std::string> entry_components(const std::string& path, const std::string& what) {
    std::vector<std::string> components = split_path(path);
    for (const std::string& component : components) {
        if (component == "..") {
            throw Error(what + ": entry '" + path + "' leads out of the image (..)");
        }
        if (component.size() > kMaxNameBytes) {
            throw Error(what + ": entry '" + path + "' has a name longer than 255 bytes");
        }
    }
    return components;
}

bool is_directory(const SquashfsEntry& entry) {
    return S_ISDIR(entry.inode->mode);
}

// Opaque directory: everything below it from layers before `layer` goes.
void drop_lower(SquashfsEntry& directory, size_t layer) {
    for (auto it = directory.children.begin(); it != directory.children.end();) {
        if (it->second->layer < layer) {
            it = directory.children.erase(it);
        } else {
            if (is_directory(*it->second)) drop_lower(*it->second, layer);
            ++it;
        }
    }
}

}  // namespace

LayerTree::LayerTree(LayerTreeLimits limits) : limits_(limits) {
    root_.inode = std::make_shared<SquashfsInode>();
    root_.inode->mode = S_IFDIR | 0755;
}

std::unique_ptr<SquashfsEntry> LayerTree::new_directory(size_t layer) const {
    auto entry = std::make_unique<SquashfsEntry>();
    entry->inode = std::make_shared<SquashfsInode>();
    entry->inode->mode = S_IFDIR | 0755;
    entry->layer = layer;
    return entry;
}

// Walks `components` from the root as the directory they name, following symlinks inside the
// tree (an absolute target starts again at the root, ".." stops at it). Missing directories are
// created when `create`, else the result is null. A component that is a file is an Error.
SquashfsEntry* LayerTree::resolve_directory(const std::vector<std::string>& components, bool create,
                                            size_t layer, const std::string& what) {
    std::vector<SquashfsEntry*> stack{&root_};
    std::deque<std::string> pending(components.begin(), components.end());
    int hops = 0;
    while (!pending.empty()) {
        std::string name = std::move(pending.front());
        pending.pop_front();
        if (name == "..") {
            if (stack.size() > 1) stack.pop_back();
            continue;
        }
        SquashfsEntry& current = *stack.back();
        auto found = current.children.find(name);
        if (found == current.children.end()) {
            if (!create) return nullptr;
            if (++entries_ > limits_.max_entries) {
                throw Error(what + ": more than " + std::to_string(limits_.max_entries) +
                            " entries");
            }
            found = current.children.emplace(name, new_directory(layer)).first;
        }
        SquashfsEntry& child = *found->second;
        const uint16_t mode = child.inode->mode;
        if (S_ISDIR(mode)) {
            stack.push_back(&child);
        } else if (S_ISLNK(mode)) {
            if (++hops > kMaxSymlinkHops) {
                throw Error(what + ": too many levels of symlinks at '" + name + "'");
            }
            const std::string& target = child.inode->link_target;
            if (!target.empty() && target.front() == '/') stack.resize(1);
            std::vector<std::string> parts = split_path(target);
            pending.insert(pending.begin(), parts.begin(), parts.end());
        } else {
            throw Error(what + ": '" + name + "' is a file, not a directory");
        }
    }
    return stack.back();
}

void LayerTree::apply(const LayerEntry& entry, size_t layer, uint64_t index,
                      const std::string& what) {
    if (++entries_ > limits_.max_entries) {
        throw Error(what + ": more than " + std::to_string(limits_.max_entries) + " entries");
    }
    std::vector<std::string> components = entry_components(entry.path, what);
    // enroot extracts with --exclude='dev/*': the runtime provides /dev.
    if (components.size() > 1 && components.front() == "dev") return;
    if (components.empty()) {  // the top directory itself ("./")
        if (!S_ISDIR(entry.mode)) throw Error(what + ": the top entry is not a directory");
        SquashfsInode& inode = *root_.inode;
        inode.mode = static_cast<uint16_t>(S_IFDIR | (entry.mode & 07777));
        inode.uid = entry.uid;
        inode.gid = entry.gid;
        inode.mtime = entry.mtime;
        inode.xattrs = entry.xattrs;
        return;
    }
    const std::string name = components.back();
    components.pop_back();

    if (starts_with(name, kWhiteoutPrefix)) {
        // Whiteouts hide what layers below have; entries of their own layer stay.
        SquashfsEntry* parent = resolve_directory(components, false, layer, what);
        if (parent == nullptr) return;
        if (name == kOpaqueMarker) {
            drop_lower(*parent, layer);
            return;
        }
        if (starts_with(name, ".wh..wh.")) return;  // aufs bookkeeping (.wh..wh.plnk), no file
        auto hidden = parent->children.find(name.substr(kWhiteoutPrefix.size()));
        if (hidden != parent->children.end() && hidden->second->layer < layer) {
            parent->children.erase(hidden);
        }
        return;
    }

    SquashfsEntry& parent = *resolve_directory(components, true, layer, what);
    auto existing = parent.children.find(name);

    if (!entry.hardlink.empty()) {
        std::vector<std::string> target = entry_components(entry.hardlink, what);
        if (target.empty()) throw Error(what + ": hard link '" + entry.path + "' to the top");
        const std::string target_name = target.back();
        target.pop_back();
        SquashfsEntry* target_parent = resolve_directory(target, false, layer, what);
        auto found = target_parent != nullptr
                         ? target_parent->children.find(target_name)
                         : std::map<std::string, std::unique_ptr<SquashfsEntry>>::iterator{};
        if (target_parent == nullptr || found == target_parent->children.end()) {
            throw Error(what + ": hard link '" + entry.path + "' to '" + entry.hardlink +
                        "', which is not in the image");
        }
        if (is_directory(*found->second)) {
            throw Error(what + ": hard link '" + entry.path + "' to a directory");
        }
        std::shared_ptr<SquashfsInode> inode = found->second->inode;
        auto link = std::make_unique<SquashfsEntry>();
        link->inode = std::move(inode);
        link->layer = layer;
        parent.children.insert_or_assign(name, std::move(link));
        return;
    }

    if (S_ISDIR(entry.mode) && existing != parent.children.end() &&
        is_directory(*existing->second)) {
        // A directory over a directory merges: new metadata, the contents stay.
        SquashfsEntry& directory = *existing->second;
        SquashfsInode& inode = *directory.inode;
        inode.mode = static_cast<uint16_t>(S_IFDIR | (entry.mode & 07777));
        inode.uid = entry.uid;
        inode.gid = entry.gid;
        inode.mtime = entry.mtime;
        inode.xattrs = entry.xattrs;
        directory.layer = layer;
        return;
    }

    auto inode = std::make_shared<SquashfsInode>();
    switch (entry.mode & S_IFMT) {
        case S_IFREG:
            inode->data_layer = layer;
            inode->data_entry = index;
            inode->data_size = entry.size;
            break;
        case S_IFLNK:
            inode->link_target = entry.symlink;
            break;
        case S_IFCHR:
        case S_IFBLK:
            inode->device_major = entry.device_major;
            inode->device_minor = entry.device_minor;
            break;
        case S_IFDIR:
        case S_IFIFO:
            break;
        default:
            throw Error(what + ": entry '" + entry.path + "' has a file type images cannot hold");
    }
    inode->mode = static_cast<uint16_t>(entry.mode & (S_IFMT | 07777));
    inode->uid = entry.uid;
    inode->gid = entry.gid;
    inode->mtime = entry.mtime;
    inode->xattrs = entry.xattrs;
    auto node = std::make_unique<SquashfsEntry>();
    node->inode = std::move(inode);
    node->layer = layer;
    parent.children.insert_or_assign(name, std::move(node));
}

void LayerTree::make_directories(const std::string& path) {
    (void)resolve_directory(split_path(path), true, 0, "creating " + path);
}

SquashfsInode& LayerTree::add_generated_file(const std::string& path, uint16_t mode,
                                             uint64_t data_size) {
    std::vector<std::string> components = split_path(path);
    const std::string name = components.back();
    components.pop_back();
    SquashfsEntry& parent = *resolve_directory(components, true, 0, "creating " + path);
    auto node = std::make_unique<SquashfsEntry>();
    node->inode = std::make_shared<SquashfsInode>();
    node->inode->mode = static_cast<uint16_t>(S_IFREG | (mode & 07777));
    node->inode->data_size = data_size;
    node->inode->data_layer = std::numeric_limits<size_t>::max();  // in no layer: the caller's
    SquashfsInode& inode = *node->inode;
    parent.children.insert_or_assign(name, std::move(node));
    return inode;
}

std::vector<std::vector<SquashfsInode*>> LayerTree::data_plan(size_t layer_count) const {
    std::vector<std::vector<SquashfsInode*>> plan(layer_count);
    std::function<void(const SquashfsEntry&)> visit = [&](const SquashfsEntry& directory) {
        for (const auto& [name, child] : directory.children) {
            SquashfsInode& inode = *child->inode;
            if (S_ISDIR(inode.mode)) {
                visit(*child);
            } else if (S_ISREG(inode.mode) && inode.data_size > 0 &&
                       inode.data_layer < layer_count) {
                plan[inode.data_layer].push_back(&inode);
            }
        }
    };
    visit(root_);
    for (auto& inodes : plan) {
        std::sort(inodes.begin(), inodes.end(), [](const SquashfsInode* a, const SquashfsInode* b) {
            return a->data_entry < b->data_entry;
        });
        inodes.erase(std::unique(inodes.begin(), inodes.end()), inodes.end());
    }
    return plan;
}

}  // namespace sqbox

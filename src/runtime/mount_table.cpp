#include "runtime/mount_table.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "image/fstab.h"
#include "image/fstab_mounts.h"
#include "runtime/mounts.h"
#include "runtime/rooted_path.h"
#include "runtime/rootfs.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr size_t kMaxFstabBytes = size_t{64} * 1024;
// Each mount costs kernel memory no limit counts; an image has no need for many.
constexpr size_t kMaxImageMounts = 64;

// The image's /etc/fstab, resolved inside the root (its symlinks cannot leave it), read only if
// it is a regular file of bounded size. Empty when the image has none.
std::string read_image_fstab(int root_fd) {
    return read_image_file(root_fd, "etc/fstab", kMaxFstabBytes, "the image's /etc/fstab");
}

VariableLookup fstab_lookup(const SandboxConfig& config) {
    return [&config](const std::string& name) -> std::optional<std::string> {
        if (name == "ENROOT_ROOTFS") return std::string(kRootfsMarker);
        const auto& variables =
            config.substitution_environment ? *config.substitution_environment : config.environment;
        for (auto it = variables.rbegin(); it != variables.rend(); ++it) {
            if (it->first == name) return it->second;
        }
        return std::nullopt;
    };
}

EntryKind kind_to_create(const MountSpec& spec, int source_fd) {
    switch (spec.create) {
        case MountSpec::Create::kFile:
            return EntryKind::kFile;
        case MountSpec::Create::kDirectory:
            return EntryKind::kDirectory;
        case MountSpec::Create::kAuto:
        case MountSpec::Create::kNever:
            break;
    }
    if (source_fd < 0) return EntryKind::kDirectory;
    struct stat st {};
    if (::fstat(source_fd, &st) != 0) throw system_error(spec.origin + ": cannot stat the source");
    return S_ISDIR(st.st_mode) ? EntryKind::kDirectory : EntryKind::kFile;
}

UniqueFd resolve_target(int root_fd, const MountSpec& spec, int source_fd, bool can_create) {
    const bool create = can_create && spec.create != MountSpec::Create::kNever;
    EntryKind kind = create ? kind_to_create(spec, source_fd) : EntryKind::kAny;
    return resolve_in_root(root_fd, spec.destination, kind, create, spec.origin);
}

uint64_t attributes_of(const MountSpec& spec) {
    uint64_t attributes = MountAttr::kNoSuid | MountAttr::kNoDev;
    if (spec.read_only) attributes |= MountAttr::kReadOnly;
    if (spec.no_exec) attributes |= MountAttr::kNoExec;
    return attributes;
}

void mount_bind(int root_fd, const MountSpec& spec, const SandboxConfig& config, bool can_create) {
    UniqueFd tree;
    if (spec.source_in == MountSpec::SourceIn::kHost) {
        tree = clone_mount_tree(AT_FDCWD, std::string(kOldRootDir) + spec.source, spec.recursive,
                                spec.origin);
    } else if (spec.source_in == MountSpec::SourceIn::kSupervisor) {
        tree = clone_mount_tree(AT_FDCWD, spec.source, spec.recursive, spec.origin);
    } else {
        UniqueFd source =
            resolve_in_root(root_fd, spec.source, EntryKind::kAny, false, spec.origin);
        tree = clone_mount_tree(source.get(), "", spec.recursive, spec.origin);
    }
    uint64_t attributes = attributes_of(spec);
    // A second view of a read-only root must not be a writable one.
    if (config.read_only_root && spec.source_in == MountSpec::SourceIn::kSandbox) {
        attributes |= MountAttr::kReadOnly;
    }
    set_mount_attributes(tree.get(), attributes, 0, true, spec.origin);
    UniqueFd target = resolve_target(root_fd, spec, tree.get(), can_create);
    attach_mount(tree.get(), target.get(), spec.origin);
}

// An image's tmpfs entry: a directory in the sandbox's own size-capped tmpfs, so however many the
// image asks for, and whatever size, they share one budget with the rest of the sandbox's
// writes. Only `mode` of its options is honoured.
void mount_image_tmpfs(int root_fd, const MountSpec& spec, bool can_create, int index) {
    mode_t mode = 0755;
    for (const auto& [key, value] : spec.filesystem_options) {
        if (key != "mode") continue;
        char* end = nullptr;
        const unsigned long parsed = std::strtoul(value.c_str(), &end, 8);
        if (end == value.c_str() || *end != '\0' || parsed > 07777) {
            throw Error(spec.origin + ": bad tmpfs mode '" + value + "'");
        }
        mode = static_cast<mode_t>(parsed & 01777);  // no setuid/setgid directories
    }
    const std::string directory =
        std::string(kSandboxDir) + "/image-tmpfs-" + std::to_string(index);
    if (::mkdir(directory.c_str(), 0700) != 0 || ::chmod(directory.c_str(), mode) != 0) {
        throw system_error(spec.origin + ": cannot create its tmpfs");
    }
    UniqueFd tree = clone_mount_tree(AT_FDCWD, directory, false, spec.origin);
    set_mount_attributes(tree.get(), attributes_of(spec), 0, true, spec.origin);
    UniqueFd target = resolve_target(root_fd, spec, -1, can_create);
    attach_mount(tree.get(), target.get(), spec.origin);
}

void mount_tmpfs(int root_fd, const MountSpec& spec, const SandboxConfig& config, bool can_create) {
    MountOptions options = writable_tmpfs_options(config.tmpfs_size_bytes, "0755");
    for (const auto& [key, value] : spec.filesystem_options) {
        auto same = [&key = key](const auto& option) { return option.first == key; };
        options.erase(std::remove_if(options.begin(), options.end(), same), options.end());
        options.emplace_back(key, value);
    }
    UniqueFd fs = create_filesystem("tmpfs", options, attributes_of(spec), spec.origin);
    UniqueFd target = resolve_target(root_fd, spec, -1, can_create);
    attach_mount(fs.get(), target.get(), spec.origin);
}

void move_mount_in_root(int root_fd, const MountSpec& spec, bool can_create) {
    UniqueFd source = resolve_in_root(root_fd, spec.source, EntryKind::kAny, false, spec.origin);
    // Without OPEN_TREE_CLONE this is the mount itself, not a copy: attaching it moves it.
    UniqueFd mount(::open_tree(source.get(), "", AT_EMPTY_PATH | OPEN_TREE_CLOEXEC));
    if (!mount) throw system_error(spec.origin + ": cannot open the mount at " + spec.source);
    UniqueFd target = resolve_target(root_fd, spec, mount.get(), can_create);
    attach_mount(mount.get(), target.get(), spec.origin);
}

void detach_mount_in_root(int root_fd, const MountSpec& spec) {
    // Resolved first: no component may be a symlink. Then by path (no /proc to name the fd
    // through before pivot_root); nothing in the sandbox runs yet to swap a component.
    (void)resolve_in_root(root_fd, spec.destination, EntryKind::kAny, false, spec.origin);
    const std::string path = std::string(kSandboxDir) + "/root" + spec.destination;
    if (::umount2(path.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
        throw system_error(spec.origin + ": cannot detach " + spec.destination);
    }
}

// What the table has mounted so far: an image may move or detach only these.
using MountedTargets = std::vector<std::string>;

void check_image_may_change(const MountSpec& spec, const MountedTargets& mounted) {
    const std::string& which = spec.kind == MountSpec::Kind::kMove ? spec.source : spec.destination;
    if (std::find(mounted.begin(), mounted.end(), which) == mounted.end()) {
        throw Error(spec.origin + ": an image may move or detach only mounts of its own fstab");
    }
}

void apply_one(int root_fd, const MountSpec& spec, const SandboxConfig& config, bool can_create,
               MountedTargets& mounted) {
    if (spec.destination == "/" && spec.kind != MountSpec::Kind::kDetach) {
        throw Error(spec.origin + ": cannot mount over the sandbox's root");
    }
    if (spec.from_image &&
        (spec.kind == MountSpec::Kind::kMove || spec.kind == MountSpec::Kind::kDetach)) {
        check_image_may_change(spec, mounted);
    }
    switch (spec.kind) {
        case MountSpec::Kind::kBind:
            mount_bind(root_fd, spec, config, can_create);
            break;
        case MountSpec::Kind::kTmpfs:
            if (spec.from_image) {
                mount_image_tmpfs(root_fd, spec, can_create, static_cast<int>(mounted.size()));
            } else {
                mount_tmpfs(root_fd, spec, config, can_create);
            }
            break;
        case MountSpec::Kind::kMove:
            move_mount_in_root(root_fd, spec, can_create);
            break;
        case MountSpec::Kind::kDetach:
            if (spec.destination == "/") throw Error(spec.origin + ": cannot detach the root");
            detach_mount_in_root(root_fd, spec);
            break;
    }
    mounted.push_back(spec.destination);
}

}  // namespace

void apply_mount_table(int root_fd, const SandboxConfig& config, bool can_create) {
    std::vector<MountSpec> table;
    if (config.image_fstab) {
        for (const auto& entry : parse_fstab(read_image_fstab(root_fd), "the image's /etc/fstab",
                                             fstab_lookup(config))) {
            try {
                if (auto spec = mount_spec_from_fstab(entry, HostSources::kRefused)) {
                    table.push_back(std::move(*spec));
                }
            } catch (const Error& e) {
                if (!entry.has_option("nofail")) throw;
                if (!entry.has_option("silent")) print_error(std::string("warning: ") + e.what());
            }
        }
    }
    if (table.size() > kMaxImageMounts) {
        throw Error("the image's /etc/fstab has more than " + std::to_string(kMaxImageMounts) +
                    " mount entries");
    }
    table.insert(table.end(), config.mounts.begin(), config.mounts.end());
    std::stable_sort(table.begin(), table.end(),
                     [](const MountSpec& a, const MountSpec& b) { return a.pass < b.pass; });
    MountedTargets mounted;
    for (const auto& spec : table) {
        try {
            apply_one(root_fd, spec, config, can_create, mounted);
        } catch (const Error& e) {
            if (!spec.optional) throw;
            print_error(std::string("warning: ") + e.what() + " (nofail: skipped)");
        }
    }
}

}  // namespace sqbox

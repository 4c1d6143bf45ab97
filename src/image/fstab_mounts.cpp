#include "image/fstab_mounts.h"

#include <array>
#include <string_view>

#include "config/config_validation.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// Options that change nothing in a sandbox whose mounts are all private, nosuid and nodev, or
// that only matter to mount(8).
constexpr std::array<std::string_view, 33> kIgnoredOptions = {
    "async",    "atime",      "dev",      "nodev",      "suid",        "nosuid",
    "diratime", "nodiratime", "dirsync",  "iversion",   "noiversion",  "mand",
    "nomand",   "noatime",    "relatime", "norelatime", "strictatime", "nostrictatime",
    "lazytime", "nolazytime", "sync",     "private",    "rprivate",    "shared",
    "rshared",  "slave",      "rslave",   "unbindable", "runbindable", "defaults",
    "auto",     "noauto",     "silent",
};
constexpr std::array<std::string_view, 8> kMountCommandOptions = {
    "group", "nogroup", "owner", "noowner", "user", "nouser", "users", "nousers",
};

template <size_t N>
bool contains(const std::array<std::string_view, N>& list, std::string_view value) {
    for (auto item : list) {
        if (item == value) return true;
    }
    return false;
}

bool starts_with_marker(const std::string& path) {
    return path.rfind(kRootfsMarker, 0) == 0;
}

// enroot's paths inside the container are relative to its root, with or without a leading "/" or
// ${ENROOT_ROOTFS}; from there on they are sandbox paths like any front end's.
std::string rooted(std::string path) {
    if (starts_with_marker(path)) path.erase(0, std::string_view(kRootfsMarker).size());
    if (path.empty() || path.front() != '/') path.insert(0, "/");
    return path;
}

std::string sandbox_path(const std::string& path, const std::string& origin) {
    return validate::sandbox_path(rooted(path), origin);
}

void set_source(MountSpec& spec, const FstabEntry& entry, HostSources host_sources) {
    if (starts_with_marker(entry.source)) {
        spec.source_in = MountSpec::SourceIn::kSandbox;
        spec.source = sandbox_path(entry.source, entry.origin);
        return;
    }
    if (host_sources == HostSources::kRefused) {
        throw Error(entry.origin + ": refusing to mount host path " + entry.source +
                    ": an image may not mount host paths (pass it with --mount if you mean it)");
    }
    spec.source_in = MountSpec::SourceIn::kHost;
    spec.source = validate::host_mount_source(entry.source, entry.origin);
}

bool is_at_or_below(const std::string& path, std::string_view top) {
    if (top == "/") return true;
    return path == top || (path.size() > top.size() && path.compare(0, top.size(), top) == 0 &&
                           path[top.size()] == '/');
}

// The image may add mounts, never take away sqbox's own (/proc with its masks, /dev) nor copy
// them elsewhere: a bind of /proc from inside the sandbox would leave the masks behind.
void refuse_system_mount_changes(const MountSpec& spec) {
    const bool moves_or_detaches =
        spec.kind == MountSpec::Kind::kMove || spec.kind == MountSpec::Kind::kDetach;
    const bool sandbox_source =
        spec.kind == MountSpec::Kind::kMove ||
        (spec.kind == MountSpec::Kind::kBind && spec.source_in == MountSpec::SourceIn::kSandbox);
    // A recursive bind of an ancestor ("/") would copy them along with everything else.
    const bool copies_below =
        spec.kind == MountSpec::Kind::kBind && sandbox_source && spec.recursive;
    for (std::string_view system : {"/proc", "/dev", "/sys"}) {
        if ((moves_or_detaches && is_at_or_below(spec.destination, system)) ||
            (sandbox_source && is_at_or_below(spec.source, system)) ||
            (copies_below && is_at_or_below(std::string(system), spec.source))) {
            throw Error(spec.origin + ": refusing to move, detach or copy sqbox's own " +
                        std::string(system) + " mounts");
        }
    }
}

}  // namespace

std::optional<MountSpec> mount_spec_from_fstab(const FstabEntry& entry, HostSources host_sources) {
    MountSpec spec;
    spec.origin = entry.origin;
    spec.pass = entry.pass;
    spec.from_image = host_sources == HostSources::kRefused;
    spec.destination = sandbox_path(entry.target, entry.origin);
    spec.create = MountSpec::Create::kNever;

    bool bind = false;
    bool recursive = false;
    for (const auto& option : entry.options) {
        if (option == "bind") {
            bind = true;
        } else if (option == "rbind") {
            bind = recursive = true;
        } else if (option == "ro") {
            spec.read_only = true;
        } else if (option == "rw") {
            spec.read_only = false;
        } else if (option == "noexec") {
            spec.no_exec = true;
        } else if (option == "exec") {
            spec.no_exec = false;
        } else if (option == "nofail") {
            spec.optional = true;
        } else if (option == "x-create=dir") {
            spec.create = MountSpec::Create::kDirectory;
        } else if (option == "x-create=file") {
            spec.create = MountSpec::Create::kFile;
        } else if (option == "x-create=auto") {
            spec.create = MountSpec::Create::kAuto;
        } else if (option == "remount") {
            throw Error(entry.origin + ": remount entries are not supported");
        } else if (option == "x-move" || option == "x-detach" || option == "loud" ||
                   contains(kIgnoredOptions, option) || contains(kMountCommandOptions, option)) {
            // x-move and x-detach are handled below; the rest change nothing in the sandbox
        } else if (entry.type == "tmpfs") {
            size_t equals = option.find('=');
            spec.filesystem_options.emplace_back(
                option.substr(0, equals),
                equals == std::string::npos ? std::string() : option.substr(equals + 1));
        } else {
            throw Error(entry.origin + ": unsupported mount option '" + option + "'");
        }
    }

    if (entry.has_option("x-detach")) {
        spec.kind = MountSpec::Kind::kDetach;
        if (host_sources == HostSources::kRefused) refuse_system_mount_changes(spec);
        return spec;
    }
    // What mounts something may not mount it over the root (an entry that only changes the
    // propagation of "/" is fine, and the runtime refuses to detach it).
    auto check_destination = [&] {
        spec.destination = validate::mount_destination(spec.destination, entry.origin);
    };
    if (entry.type == "tmpfs") {
        check_destination();
        spec.kind = MountSpec::Kind::kTmpfs;
        if (spec.create == MountSpec::Create::kAuto) spec.create = MountSpec::Create::kDirectory;
        return spec;
    }
    if (entry.type != "none") {
        throw Error(entry.origin + ": unsupported filesystem type '" + entry.type +
                    "' (sqbox mounts bind, rbind and tmpfs entries)");
    }
    if (entry.has_option("x-move")) {
        if (!starts_with_marker(entry.source)) {
            throw Error(entry.origin +
                        ": x-move needs a source inside the container (${ENROOT_ROOTFS}/...)");
        }
        spec.kind = MountSpec::Kind::kMove;
        spec.source_in = MountSpec::SourceIn::kSandbox;
        spec.source = sandbox_path(entry.source, entry.origin);
        if (host_sources == HostSources::kRefused) refuse_system_mount_changes(spec);
        check_destination();
        return spec;
    }
    if (!bind) return std::nullopt;  // propagation changes only
    spec.kind = MountSpec::Kind::kBind;
    spec.recursive = recursive;
    set_source(spec, entry, host_sources);
    if (host_sources == HostSources::kRefused) refuse_system_mount_changes(spec);
    check_destination();
    return spec;
}

}  // namespace sqbox

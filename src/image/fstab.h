// Parser for mount tables in enroot's fstab dialect: an image's /etc/fstab, the lines of a
// configuration script's mounts(), and enroot's colon-separated `--mount` arguments.
//
// enroot's extensions to fstab(5): targets are relative to the container's root; fields may be
// omitted where they can be guessed ("tmpfs /tmp", "/src /dst", "/src bind");
// `x-create=dir|file|auto` creates the mount point; `x-move` and `x-detach` move or detach a mount;
// ${VAR} is substituted; fs_passno orders the mounts (fs_freq stands in for it when only fs_freq is
// given).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "image/environment_file.h"

namespace sqbox {

struct FstabEntry {
    std::string source;                // fs_spec
    std::string target;                // fs_file, inside the container's root
    std::string type;                  // fs_vfstype: "none" for binds, moves and detaches
    std::vector<std::string> options;  // fs_mntops, split at commas
    int pass = 0;                      // fs_passno: mounts happen in increasing order of it
    std::string origin;                // "FILE line N", for messages

    [[nodiscard]] bool has_option(std::string_view name) const;
};

// Parses whitespace-separated fstab lines. Blank and '#' lines are skipped; ${NAME} is replaced
// through `lookup` (unset: empty), as enroot does. A line that cannot be completed throws Error
// naming `origin_name` and the line number.
std::vector<FstabEntry> parse_fstab(std::string_view content, const std::string& origin_name,
                                    const VariableLookup& lookup);

// Parses one `--mount` argument: the fstab fields separated by colons ("SRC:DST[:TYPE[:OPTS]]"),
// taken literally (enroot substitutes nothing there: the caller's shell already has).
FstabEntry parse_mount_argument(const std::string& argument);

}  // namespace sqbox

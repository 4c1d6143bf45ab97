#include "runtime/sandbox_user.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "runtime/rooted_path.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {
namespace {

constexpr const char* kDefaultShell = "/bin/sh";
constexpr std::string_view kAptAccount = "_apt";

// The name and the numeric id (third field) of one passwd or group line; an id of -1 when the
// field is not a plain number.
struct LineKey {
    std::string_view name;
    long long id = -1;
};

LineKey key_of(std::string_view line) {
    LineKey key;
    const size_t name_end = line.find(':');
    key.name = line.substr(0, name_end);
    if (name_end == std::string_view::npos) return key;
    const size_t id_start = line.find(':', name_end + 1);
    if (id_start == std::string_view::npos) return key;
    const std::string_view id =
        line.substr(id_start + 1, line.find(':', id_start + 1) - id_start - 1);
    if (id.empty() || id.size() > 10 ||
        !std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return key;
    }
    key.id = std::stoll(std::string(id));
    return key;
}

std::vector<std::string_view> lines_of(std::string_view text) {
    std::vector<std::string_view> lines;
    while (!text.empty()) {
        const size_t end = text.find('\n');
        const std::string_view line = text.substr(0, end);
        if (!line.empty()) lines.push_back(line);
        if (end == std::string_view::npos) break;
        text.remove_prefix(end + 1);
    }
    return lines;
}

struct Entry {
    std::string name;
    long long id;
    std::string line;  // without its newline
};

// The merge both files share: `own` first unless the image's entry for id 0 is kept, then the
// image's lines but those `own` replaces and _apt's, then `defaults` the result lacks (by name or
// id).
std::string merge_accounts(std::string_view image, const Entry& own,
                           const std::vector<Entry>& defaults) {
    const std::vector<std::string_view> image_lines = lines_of(image);
    const bool keep_image_entry =
        own.id == 0 && std::any_of(image_lines.begin(), image_lines.end(),
                                   [](std::string_view line) { return key_of(line).id == 0; });
    std::vector<LineKey> kept;
    std::string out;
    out.reserve(image.size() + 256);
    if (!keep_image_entry) {
        out += own.line + "\n";
        kept.push_back({own.name, own.id});
    }
    for (const std::string_view line : image_lines) {
        const LineKey key = key_of(line);
        if (key.name == kAptAccount) continue;
        if (!keep_image_entry && key.name == own.name) continue;
        out.append(line).push_back('\n');
        kept.push_back(key);
    }
    for (const Entry& entry : defaults) {
        const bool present = std::any_of(kept.begin(), kept.end(), [&entry](const LineKey& key) {
            return key.name == entry.name || key.id == entry.id;
        });
        if (!present) out += entry.line + "\n";
    }
    return out;
}

std::string name_of_user(uid_t uid) {
    std::vector<char> buffer(16384);
    passwd entry{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
        return {};
    }
    return found->pw_name;
}

std::string name_of_group(gid_t gid) {
    std::vector<char> buffer(16384);
    group entry{};
    group* found = nullptr;
    if (::getgrgid_r(gid, &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
        return {};
    }
    return found->gr_name;
}

}  // namespace

void set_caller_identity(SandboxConfig& config) {
    config.outside_uid = ::geteuid();
    config.outside_gid = ::getegid();
    // The host's account database (NSS: files, sssd, LDAP) only for a name the sandbox shows: as
    // root inside, the user and group are the image's root.
    if (!config.map_root && config.outside_uid != 0) {
        config.outside_user_name = name_of_user(config.outside_uid);
    }
    if (!config.map_root && config.outside_gid != 0) {
        config.outside_group_name = name_of_group(config.outside_gid);
    }
}

bool is_portable_account_name(std::string_view name) {
    if (name.empty() || name.size() > 32 || name.front() == '-' || name == "." || name == "..") {
        return false;
    }
    const auto portable = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
    };
    const auto digit = [](char c) { return c >= '0' && c <= '9'; };
    return std::all_of(name.begin(), name.end(), portable) &&
           !std::all_of(name.begin(), name.end(), digit);
}

SandboxUser sandbox_user(const SandboxConfig& config) {
    SandboxUser user;
    user.uid = config.map_root ? 0 : config.outside_uid;
    user.gid = config.map_root ? 0 : config.outside_gid;
    user.shell = kDefaultShell;
    if (user.uid == 0) {
        user.name = "root";
        user.home = "/root";
    } else {
        // "root" would stand for two uids.
        const bool usable = is_portable_account_name(config.outside_user_name) &&
                            config.outside_user_name != "root";
        user.name = usable ? config.outside_user_name : kFallbackUserName;
        user.home = kSandboxUserHome;
    }
    if (user.gid == 0) {
        user.group = "root";
    } else {
        const bool usable = is_portable_account_name(config.outside_group_name) &&
                            config.outside_group_name != "root";
        user.group = usable ? config.outside_group_name : user.name;
    }
    return user;
}

std::string merged_passwd(std::string_view image_passwd, const SandboxUser& user) {
    const std::string uid = std::to_string(user.uid);
    const std::string gid = std::to_string(user.gid);
    const std::string overflow = std::to_string(kOverflowId);
    const Entry own{
        user.name, user.uid,
        user.name + ":x:" + uid + ":" + gid + ":" + user.name + ":" + user.home + ":" + user.shell};
    return merge_accounts(
        image_passwd, own,
        {{"root", 0, std::string("root:x:0:0:root:/root:") + kDefaultShell},
         {"nobody", kOverflowId,
          "nobody:x:" + overflow + ":" + overflow + ":nobody:/nonexistent:/usr/sbin/nologin"}});
}

std::string merged_group(std::string_view image_group, const SandboxUser& user) {
    const Entry own{user.group, user.gid, user.group + ":x:" + std::to_string(user.gid) + ":"};
    return merge_accounts(image_group, own,
                          {{"root", 0, "root:x:0:"}, {"nogroup", kOverflowId, "nogroup:x:65534:"}});
}

AccountFiles sandbox_account_files(int root_fd, const SandboxConfig& config) {
    const SandboxUser user = sandbox_user(config);
    return {merged_passwd(read_image_file(root_fd, "etc/passwd", kMaxAccountFileBytes,
                                          "the image's /etc/passwd"),
                          user),
            merged_group(read_image_file(root_fd, "etc/group", kMaxAccountFileBytes,
                                         "the image's /etc/group"),
                         user)};
}

}  // namespace sqbox

#include "image/warm_up_list.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr std::string_view kHeader = "sqbox-warm-up 1\n";

// A list file larger than this is not one sqbox wrote.
constexpr size_t kMaxListFileBytes = kMaxWarmUpNames * (kMaxWarmUpPathBytes + 2) + kHeader.size();

// A squashfs superblock: 96 bytes at the start of the image.
constexpr size_t kSuperblockBytes = 96;

bool valid_path(std::string_view path) {
    if (path.size() < 2 || path.size() > kMaxWarmUpPathBytes || path.front() != '/') return false;
    size_t start = 1;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string_view::npos) end = path.size();
        const std::string_view part = path.substr(start, end - start);
        if (part.empty() || part == "." || part == "..") return false;
        start = end + 1;
    }
    return true;
}

// Decodes records from `data`; `complete` says whether the data ended on a record boundary.
std::vector<WarmUpName> decode_records(std::string_view data, bool& complete) {
    std::vector<WarmUpName> names;
    complete = true;
    while (!data.empty()) {
        const size_t end = data.find('\0');
        if (end == std::string_view::npos) {
            complete = false;
            break;
        }
        const auto kind = static_cast<WarmUpKind>(data.front());
        const std::string_view path = data.substr(1, end - 1);
        if ((kind == WarmUpKind::kLookUp || kind == WarmUpKind::kRead ||
             kind == WarmUpKind::kList) &&
            valid_path(path)) {
            names.push_back({std::string(path), kind});
        }
        data.remove_prefix(end + 1);
    }
    return names;
}

// FNV-1a, 64 bits: stable across builds and machines, unlike std::hash.
uint64_t fnv1a(std::string_view bytes, uint64_t hash = 0xcbf29ce484222325ULL) {
    for (unsigned char byte : bytes) {
        hash ^= byte;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
}

void make_private_directory(const std::string& path) {
    size_t slash = 0;
    while ((slash = path.find('/', slash + 1)) != std::string::npos) {
        const std::string parent = path.substr(0, slash);
        if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) {
            throw system_error("cannot create " + parent);
        }
    }
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
        throw system_error("cannot create " + path);
    }
}

}  // namespace

std::string encode_warm_up_record(const WarmUpName& name) {
    std::string record;
    record.reserve(name.path.size() + 2);
    record += static_cast<char>(name.kind);
    record += name.path;
    record += '\0';
    return record;
}

std::vector<WarmUpName> decode_warm_up_records(std::string_view data) {
    bool complete = false;
    return decode_records(data, complete);
}

std::string encode_warm_up_list(const std::vector<WarmUpName>& names) {
    std::string data(kHeader);
    for (const auto& name : names) data += encode_warm_up_record(name);
    return data;
}

std::optional<std::vector<WarmUpName>> decode_warm_up_list(std::string_view data) {
    if (!data.starts_with(kHeader)) return std::nullopt;
    bool complete = false;
    std::vector<WarmUpName> names = decode_records(data.substr(kHeader.size()), complete);
    if (!complete) return std::nullopt;
    if (names.size() > kMaxWarmUpNames) names.resize(kMaxWarmUpNames);
    return names;
}

std::vector<WarmUpName> merge_warm_up_names(std::vector<WarmUpName> known,
                                            const std::vector<WarmUpName>& learned) {
    if (known.size() > kMaxWarmUpNames) known.resize(kMaxWarmUpNames);
    std::unordered_map<std::string, size_t> position;
    for (size_t i = 0; i < known.size(); ++i) position.try_emplace(known[i].path, i);
    for (const auto& name : learned) {
        auto found = position.find(name.path);
        if (found != position.end()) {
            WarmUpKind& kind = known[found->second].kind;
            if (kind == WarmUpKind::kLookUp) kind = name.kind;
        } else if (known.size() < kMaxWarmUpNames) {
            position.emplace(name.path, known.size());
            known.push_back(name);
        }
    }
    return known;
}

std::string warm_up_directory() {
    std::string base = environment("SQBOX_CACHE_DIR");
    if (base.empty()) {
        const std::string xdg = environment("XDG_CACHE_HOME");
        if (!xdg.empty()) {
            base = xdg + "/sqbox";
        } else {
            const std::string home = environment("HOME");
            if (home.empty()) return "";
            base = home + "/.cache/sqbox";
        }
    }
    return base + "/warm-up";
}

std::string warm_up_list_name(int image_fd) {
    std::array<char, kSuperblockBytes> superblock{};
    struct stat info {};
    if (::pread(image_fd, superblock.data(), superblock.size(), 0) !=
            static_cast<ssize_t>(superblock.size()) ||
        ::fstat(image_fd, &info) != 0) {
        throw system_error("cannot read the image's superblock");
    }
    const auto size = static_cast<uint64_t>(info.st_size);
    uint64_t hash = fnv1a(std::string_view(superblock.data(), superblock.size()));
    hash = fnv1a(std::string_view(reinterpret_cast<const char*>(&size), sizeof size), hash);
    char name[17];
    (void)std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(hash));
    return name;
}

std::optional<std::vector<WarmUpName>> load_warm_up_list(const std::string& path) {
    UniqueFd file(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file) {
        if (errno == ENOENT) return std::vector<WarmUpName>{};
        if (errno == ELOOP) return std::nullopt;  // a symlink: not a list sqbox wrote
        throw system_error("cannot open the warm-up list " + path);
    }
    struct stat info {};
    if (::fstat(file.get(), &info) != 0) throw system_error("cannot stat " + path);
    if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) > kMaxListFileBytes) {
        return std::nullopt;
    }
    return decode_warm_up_list(read_all(file.get(), "the warm-up list " + path));
}

void save_warm_up_list(const std::string& path, const std::vector<WarmUpName>& names) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) throw Error("bad warm-up list path " + path);
    make_private_directory(path.substr(0, slash));
    const std::string temporary = path + ".tmp." + std::to_string(::getpid());
    try {
        write_file_at(AT_FDCWD, temporary, encode_warm_up_list(names), O_EXCL | O_NOFOLLOW, 0600);
        if (::rename(temporary.c_str(), path.c_str()) != 0) {
            throw system_error("cannot save the warm-up list " + path);
        }
    } catch (const Error&) {
        (void)::unlink(temporary.c_str());  // a full disk leaves nothing half-written behind
        throw;
    }
}

}  // namespace sqbox

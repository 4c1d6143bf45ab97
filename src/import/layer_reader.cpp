#include "import/layer_reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "util/errors.h"

namespace sqbox {
namespace {

constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxXattrBytes = 64 * 1024;  // Linux's limit for one file's attributes
constexpr size_t kReadBlockBytes = 256 * 1024;

}  // namespace

LayerReader::LayerReader(int fd, std::string what) : what_(std::move(what)) {
    if (::lseek(fd, 0, SEEK_SET) != 0) throw system_error("cannot rewind " + what_);
    archive_ = archive_read_new();
    if (archive_ == nullptr) throw Error(what_ + ": out of memory");
    // ARCHIVE_WARN would mean an external (de)compressor program: never run one.
    if (archive_read_support_filter_gzip(archive_) != ARCHIVE_OK ||
        archive_read_support_filter_zstd(archive_) != ARCHIVE_OK ||
        archive_read_support_format_tar(archive_) != ARCHIVE_OK) {
        const std::string message = archive_message();
        archive_read_free(archive_);
        throw Error(what_ + ": libarchive cannot read gzip, zstd or tar here: " + message);
    }
    if (archive_read_open_fd(archive_, fd, kReadBlockBytes) != ARCHIVE_OK) {
        const std::string message = archive_message();
        archive_read_free(archive_);
        throw Error(what_ + ": " + message);
    }
}

LayerReader::~LayerReader() {
    // Freeing a reader releases memory only; its descriptor is the caller's.
    (void)archive_read_free(archive_);
}

std::string LayerReader::archive_message() const {
    const char* message = archive_error_string(archive_);
    return message != nullptr ? message : "unreadable archive";
}

void LayerReader::check_expansion() {
    if (archive_filter_count(archive_) < 2) return;  // not compressed
    const la_int64_t expanded = archive_filter_bytes(archive_, 0);
    const la_int64_t compressed = archive_filter_bytes(archive_, -1);
    if (expanded < 0 || compressed < 0) return;
    const auto limit = std::max<uint64_t>(kExpansionFloorBytes,
                                          static_cast<uint64_t>(compressed) * kMaxExpansionRatio);
    if (static_cast<uint64_t>(expanded) > limit) {
        throw Error(what_ + ": decompresses to more than " + std::to_string(kMaxExpansionRatio) +
                    " times its size (a decompression bomb?)");
    }
}

bool LayerReader::next(LayerEntry& entry) {
    struct archive_entry* header = nullptr;
    const int status = archive_read_next_header(archive_, &header);
    check_expansion();
    if (status == ARCHIVE_EOF) return false;
    if (status != ARCHIVE_OK && status != ARCHIVE_WARN) {
        throw Error(what_ + ": " + archive_message());
    }
    entry = LayerEntry{};
    const char* path = archive_entry_pathname(header);
    if (path == nullptr || *path == '\0') throw Error(what_ + ": an entry without a name");
    entry.path = path;
    if (entry.path.size() > kMaxPathBytes) {
        throw Error(what_ + ": an entry's name is longer than " + std::to_string(kMaxPathBytes) +
                    " bytes");
    }
    if (const char* target = archive_entry_hardlink(header); target != nullptr) {
        entry.hardlink = target;
    }
    entry.mode = archive_entry_mode(header);
    if (archive_entry_uid(header) < 0 ||
        archive_entry_uid(header) > std::numeric_limits<uint32_t>::max() ||
        archive_entry_gid(header) < 0 ||
        archive_entry_gid(header) > std::numeric_limits<uint32_t>::max()) {
        throw Error(what_ + ": " + entry.path + ": owner out of range");
    }
    entry.uid = static_cast<uint32_t>(archive_entry_uid(header));
    entry.gid = static_cast<uint32_t>(archive_entry_gid(header));
    entry.mtime = archive_entry_mtime(header);
    if (S_ISCHR(entry.mode) || S_ISBLK(entry.mode)) {
        entry.device_major = static_cast<unsigned int>(archive_entry_rdevmajor(header));
        entry.device_minor = static_cast<unsigned int>(archive_entry_rdevminor(header));
    }
    if (const char* target = archive_entry_symlink(header); target != nullptr) {
        entry.symlink = target;
        if (entry.symlink.size() >= kMaxPathBytes) {
            throw Error(what_ + ": " + entry.path + ": symlink target too long");
        }
    }
    entry.size = archive_entry_size_is_set(header) != 0
                     ? static_cast<uint64_t>(std::max<la_int64_t>(archive_entry_size(header), 0))
                     : 0;
    size_t xattr_bytes = 0;
    archive_entry_xattr_reset(header);
    const char* name = nullptr;
    const void* value = nullptr;
    size_t value_size = 0;
    while (archive_entry_xattr_next(header, &name, &value, &value_size) == ARCHIVE_OK) {
        xattr_bytes += std::char_traits<char>::length(name) + value_size;
        if (xattr_bytes > kMaxXattrBytes) {
            throw Error(what_ + ": " + entry.path + ": more than 64 KiB of extended attributes");
        }
        entry.xattrs.emplace_back(name, std::string(static_cast<const char*>(value), value_size));
    }
    return true;
}

size_t LayerReader::read_data(void* buffer, size_t size) {
    const la_ssize_t count = archive_read_data(archive_, buffer, size);
    if (count < 0) throw Error(what_ + ": " + archive_message());
    check_expansion();
    return static_cast<size_t>(count);
}

}  // namespace sqbox

// Reading one image layer (a tar stream, uncompressed, gzip or zstd) entry by entry with
// libarchive, without writing anything anywhere: headers as LayerEntry values, then, on request,
// the current entry's data. Limits keep a hostile layer from taking unbounded memory or time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct archive;

namespace sqbox {

struct LayerEntry {
    std::string path;      // as in the archive
    std::string hardlink;  // the earlier path this entry is a hard link to, or empty
    mode_t mode = 0;       // file type and permission bits
    uint32_t uid = 0;
    uint32_t gid = 0;
    int64_t mtime = 0;
    unsigned int device_major = 0;
    unsigned int device_minor = 0;
    std::string symlink;  // symlinks' targets
    uint64_t size = 0;    // regular files' declared size
    std::vector<std::pair<std::string, std::string>> xattrs;
};

// The largest a decompressed layer may grow relative to its compressed size before it is taken
// for a decompression bomb (gzip cannot exceed ~1032), with a floor for small layers.
inline constexpr uint64_t kMaxExpansionRatio = 1100;
inline constexpr uint64_t kExpansionFloorBytes = uint64_t{1} << 30;

class LayerReader {
  public:
    // Reads from `fd` (borrowed, from offset 0); `what` names the layer in messages.
    LayerReader(int fd, std::string what);
    LayerReader(const LayerReader&) = delete;
    LayerReader& operator=(const LayerReader&) = delete;
    ~LayerReader();

    // The next entry; false at the end of the archive. Throws Error on a damaged or hostile one.
    bool next(LayerEntry& entry);
    // Up to `size` bytes of the current entry's data; 0 at its end.
    size_t read_data(void* buffer, size_t size);

  private:
    void check_expansion();
    [[nodiscard]] std::string archive_message() const;

    std::string what_;
    struct archive* archive_ = nullptr;
};

}  // namespace sqbox

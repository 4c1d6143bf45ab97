// The download cache: verified blobs under CACHE/blobs/sha256/<hex> (an OCI layout's blob
// naming, beside but apart from enroot's own files in the same $ENROOT_CACHE_PATH, which hold
// re-compressed layers under the bare hex digest). A blob appears under its name only once its
// digest is verified, so a file there is always complete.
#pragma once

#include <filesystem>
#include <string>

#include "util/unique_fd.h"

namespace sqbox {

class BlobCache {
  public:
    explicit BlobCache(const std::filesystem::path& cache_dir);

    [[nodiscard]] std::filesystem::path path_of(const std::string& digest) const;
    [[nodiscard]] bool contains(const std::string& digest) const;

    // A download in progress: an unnamed file in the cache directory (O_TMPFILE) or, where the
    // file system has none, a hidden temporary removed unless committed.
    class Pending {
      public:
        Pending(const Pending&) = delete;
        Pending& operator=(const Pending&) = delete;
        Pending(Pending&&) noexcept = default;
        Pending& operator=(Pending&&) noexcept = default;
        ~Pending();

        [[nodiscard]] int fd() const { return fd_.get(); }
        // Gives the verified file its name (keeping one already there: same digest, same bytes).
        void commit();

      private:
        friend class BlobCache;
        Pending(UniqueFd fd, std::filesystem::path temporary, std::filesystem::path final_path)
            : fd_(std::move(fd)), temporary_(std::move(temporary)), final_(std::move(final_path)) {}
        UniqueFd fd_;
        std::filesystem::path temporary_;  // empty for an unnamed file
        std::filesystem::path final_;
    };

    // Creates the cache directories as needed. Throws Error when they cannot be written.
    Pending begin(const std::string& digest) const;

  private:
    std::filesystem::path blobs_;
};

}  // namespace sqbox

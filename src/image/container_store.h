// enroot's container store ($ENROOT_DATA_PATH), the sqbox way: a container is not an unpacked
// copy of its image but a reference to the .sqsh plus a persistent writable layer, so creating
// one costs a few file operations whatever the image's size.
//
// Layout of DATA/NAME/: container.json (the image's path and identity), upper/ and work/ (the
// overlay layer), lock (held shared by read-only starts, exclusively by --rw starts). Directories
// that real enroot unpacked there are listed, started (as read-only directory images) and removed
// too. Every change of the store happens under DATA/.sqbox-store.lock, and names change by
// rename(2) only, so concurrent creates, starts and removes never see a half-made container.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

struct ContainerInfo {
    std::string name;
    std::string directory;     // DATA/NAME
    std::string image;         // the .sqsh it was created from; empty for an unpacked rootfs
    std::string layer;         // directory holding upper/ and work/; empty for an unpacked rootfs
    uint64_t layer_bytes = 0;  // what the persistent layer holds (list --fancy)
};

class ContainerStore {
  public:
    explicit ContainerStore(std::string data_path);

    [[nodiscard]] const std::string& path() const { return data_path_; }

    // enroot's rules for a container name: not empty, no '/', not "." or ".."; names starting with
    // ".sqbox-" are the store's own.
    static void check_name(const std::string& name);

    // Creates NAME for the squashfs `image` (absolute). Throws "File already exists" unless
    // `replace`, in which case the old container is removed first.
    void create(const std::string& name, const std::string& image, bool replace);

    // Removes NAME; throws "No such file or directory" when there is none.
    void remove(const std::string& name);

    // The container NAME, or nullopt. Throws if its image changed since it was created.
    [[nodiscard]] std::optional<ContainerInfo> find(const std::string& name) const;

    // All container names, sorted.
    [[nodiscard]] std::vector<std::string> names() const;

  private:
    [[nodiscard]] UniqueFd lock_store() const;
    void sweep_trash() const;

    std::string data_path_;
};

// Holds a container's lock for as long as it lives: shared for a read-only start, exclusive for a
// start that writes the persistent layer (waits up to `wait_seconds`, then throws).
class ContainerLock {
  public:
    ContainerLock(const ContainerInfo& container, bool exclusive, int wait_seconds);

  private:
    UniqueFd fd_;
};

}  // namespace sqbox

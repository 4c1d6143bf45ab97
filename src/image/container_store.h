// enroot's container store ($ENROOT_DATA_PATH), the sqbox way: a container is not an unpacked
// copy of its image but a reference to the .sqsh plus a persistent writable layer, so creating
// one costs a few file operations whatever the image's size.
//
// Layout: DATA/NAME is a symlink to the container's own directory, DATA/.sqbox-container-XXXXXXXX/,
// which holds container.json (the image's path and identity), upper/ and work/ (the overlay
// layer) and lock (held shared by read-only starts, exclusively by --rw starts). Directories at
// DATA/NAME (real enroot's unpacked root filesystems, and containers made by older sqbox) are
// listed, started (the former as read-only directory images) and removed too; they move with their
// name, so the guarantee below is only that they are not deleted under a start.
//
// Every change of a name happens under DATA/.sqbox-store.lock, by symlink(2) or rename(2) only,
// so concurrent creates, starts and removes never see a half-made container. A container's
// directory never moves: a remove or a replace renames the name to DATA/.sqbox-trash-XXXXXXXX
// and deletes the directory only when no start holds it (flock: shared by each start, exclusive
// while deleting). The last start to let go of a removed container deletes it; so a start runs
// the container its name meant when it began, whole, whatever happens to the name meanwhile.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace sqbox {

struct ContainerInfo {
    std::string name;
    std::string directory;     // the container's own directory (DATA/NAME for a directory there)
    std::string image;         // the .sqsh it was created from; empty for an unpacked rootfs
    std::string layer;         // directory holding upper/ and work/; empty for an unpacked rootfs
    uint64_t layer_bytes = 0;  // what the persistent layer holds (list --fancy)
};

// A container found in the store, with a shared flock on its directory: while it is held, its
// directory is not deleted, even if the container is removed or replaced, and `info`'s paths keep
// naming it (not NAME, which may come to mean another container).
struct HeldContainer {
    ContainerInfo info;
    UniqueFd directory;
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

    // The container NAME, held until `release`, or nullopt. Throws if its image changed since it
    // was created.
    [[nodiscard]] std::optional<HeldContainer> find(const std::string& name) const;

    // Lets go of a container; if it was removed or replaced meanwhile and nobody else holds it,
    // deletes it (with any other trash no longer held).
    void release(HeldContainer container) const;

    // All container names, sorted.
    [[nodiscard]] std::vector<std::string> names() const;

  private:
    [[nodiscard]] UniqueFd lock_store() const;
    // NAME's directory, or nullopt when there is no container NAME.
    [[nodiscard]] std::optional<std::string> directory_of(const std::string& name) const;
    // Deletes what a removed name leaves: the container's directory unless a start holds it (the
    // trash symlink then stays, for the last start to find), and the name itself.
    void collect_trash(const std::string& trash) const;
    void sweep_trash() const;

    std::string data_path_;
};

// Holds a container's lock for as long as it lives: shared for a read-only start, exclusive for a
// start that writes the persistent layer (waits up to `wait_seconds`, then throws).
class ContainerLock {
  public:
    ContainerLock(const HeldContainer& container, bool exclusive, int wait_seconds);

  private:
    UniqueFd fd_;
};

}  // namespace sqbox

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
// the container its name meant when it began, whole, whatever happens to the name meanwhile. A
// start holds a container only while its name still means it, so it never holds one that a
// killed remove left half deleted. A create holds its new directory exclusively until it names
// it; sweeps (after each remove, and by a start that lets go of a removed container) delete
// unheld trash and the directories nothing names (a killed create's).
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

class HeldContainer;

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

    // The container NAME, held for as long as the result lives, or nullopt. Throws if its image
    // changed since it was created.
    [[nodiscard]] std::optional<HeldContainer> find(const std::string& name) const;

    // All container names, sorted.
    [[nodiscard]] std::vector<std::string> names() const;

  private:
    friend class HeldContainer;

    [[nodiscard]] UniqueFd lock_store() const;
    // NAME's directory, or nullopt when there is no container NAME.
    [[nodiscard]] std::optional<std::string> directory_of(const std::string& name) const;
    // Renames `path` (a name: a link or a directory) to a new trash name, which it returns.
    [[nodiscard]] std::string move_to_trash(const std::string& path) const;
    // Deletes what a removed name leaves: the container's directory unless a start holds it (the
    // trash symlink then stays, for the last start to find), and the name itself.
    void collect_trash(const std::string& trash) const;
    // Collects all trash nobody holds, and the container directories that neither a name nor
    // trash links to (a create killed before it named its container leaves one).
    void sweep() const;
    void delete_orphans() const;

    std::string data_path_;
};

// A container found in the store, with a shared flock on its directory: while it is held, its
// directory is not deleted, even if the container is removed or replaced, and `info`'s paths keep
// naming it (not NAME, which may come to mean another container). Letting go of it (destruction)
// deletes it if it was removed meanwhile and nobody else holds it.
class HeldContainer {
  public:
    HeldContainer(HeldContainer&& other) noexcept = default;
    HeldContainer& operator=(HeldContainer&& other) noexcept;
    HeldContainer(const HeldContainer&) = delete;
    HeldContainer& operator=(const HeldContainer&) = delete;
    ~HeldContainer() { let_go(); }

    [[nodiscard]] const ContainerInfo& info() const { return info_; }
    [[nodiscard]] int directory_fd() const { return directory_.get(); }

  private:
    friend class ContainerStore;
    explicit HeldContainer(ContainerStore store) : store_(std::move(store)) {}
    void let_go() noexcept;

    ContainerStore store_;
    ContainerInfo info_;
    UniqueFd directory_;  // flocked shared; empty only once moved from
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

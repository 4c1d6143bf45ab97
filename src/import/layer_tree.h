// The image's final tree, built from its layers' headers alone (metadata, no file data): each
// layer applied in order over the ones below, with OCI whiteouts (.wh.NAME) and opaque
// directories (.wh..wh..opq), as a plain in-memory tree that no path of an entry can leave.
// Which entry of which layer holds each surviving file's data is recorded, so that a second
// pass over the layers can stream exactly that data into the image.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image/squashfs_builder.h"
#include "import/layer_reader.h"

namespace sqbox {

struct LayerTreeLimits {
    uint64_t max_entries = 8'000'000;  // headers over all layers: bounds the tree's memory
};

class LayerTree {
  public:
    explicit LayerTree(LayerTreeLimits limits = {});

    // Applies one header of layer `layer` (numbered from 0, base first), its `index`-th entry.
    // Throws Error (naming `what`, the layer) for an entry that cannot be part of an image:
    // `..` in its path, a hard link to nothing or to a directory, a path through a file.
    // Leading '/' are dropped and symlinks met on the way are followed inside the tree only, as
    // the layer means it; entries below dev/ are left out as enroot does.
    void apply(const LayerEntry& entry, size_t layer, uint64_t index, const std::string& what);

    // A file sqbox adds (enroot's /etc/rc and friends): replaces whatever is at `path`, creating
    // missing directories. Its data is the caller's to write through SquashfsBuilder.
    SquashfsInode& add_generated_file(const std::string& path, uint16_t mode, uint64_t data_size);
    // mkdir -p inside the tree (symlinks followed inside it).
    void make_directories(const std::string& path);

    // For each layer, the inodes whose data it holds, in the order of its entries.
    [[nodiscard]] std::vector<std::vector<SquashfsInode*>> data_plan(size_t layer_count) const;

    SquashfsEntry& root() { return root_; }

  private:
    SquashfsEntry* resolve_directory(const std::vector<std::string>& components, bool create,
                                     size_t layer, const std::string& what);
    std::unique_ptr<SquashfsEntry> new_directory(size_t layer) const;

    LayerTreeLimits limits_;
    uint64_t entries_ = 0;
    SquashfsEntry root_;
};

}  // namespace sqbox

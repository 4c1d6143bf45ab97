#include "import/image_import.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "import/enroot_image_files.h"
#include "import/layer_reader.h"
#include "import/layer_tree.h"
#include "security/landlock.h"
#include "security/parser_process.h"
#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr size_t kCopyBlockBytes = 256 * 1024;

// Removes a path on the way out unless released.
class RemoveOnExit {
  public:
    explicit RemoveOnExit(std::filesystem::path path) : path_(std::move(path)) {}
    RemoveOnExit(const RemoveOnExit&) = delete;
    RemoveOnExit& operator=(const RemoveOnExit&) = delete;
    ~RemoveOnExit() {
        // Nothing to report to on the way out; a missing file is what we want anyway.
        if (!path_.empty()) (void)::unlink(path_.c_str());
    }
    void release() { path_.clear(); }

  private:
    std::filesystem::path path_;
};

std::vector<UniqueFd> open_layers(const ImageLayers& image) {
    std::vector<UniqueFd> fds;
    for (const ImageLayer& layer : image.layers) {
        UniqueFd fd(::open(layer.blob.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
        if (!fd)
            throw system_error("cannot open layer " + layer.digest + " (" + layer.blob.string() +
                               ")");
        fds.push_back(std::move(fd));
    }
    return fds;
}

std::string layer_name(const ImageLayers& image, size_t index) {
    return "layer " + std::to_string(index + 1) + " (" + image.layers[index].digest + ")";
}

void write_layer_data(SquashfsBuilder& builder, int fd, const std::string& what,
                      const std::vector<SquashfsInode*>& wanted, std::vector<char>& buffer) {
    if (wanted.empty()) return;
    LayerReader reader(fd, what);
    LayerEntry entry;
    size_t next = 0;
    for (uint64_t index = 0; next < wanted.size() && reader.next(entry); ++index) {
        SquashfsInode& inode = *wanted[next];
        if (inode.data_entry != index) continue;
        ++next;
        if (entry.size != inode.data_size) {
            throw Error(what + ": '" + entry.path + "' changed between two reads of the layer");
        }
        builder.begin_file(inode);
        uint64_t total = 0;
        for (;;) {
            const size_t count = reader.read_data(buffer.data(), buffer.size());
            if (count == 0) break;
            total += count;
            if (total > inode.data_size) break;
            builder.append(buffer.data(), count);
        }
        if (total != inode.data_size) {
            throw Error(what + ": '" + entry.path + "' holds " + std::to_string(total) +
                        " bytes, its header says " + std::to_string(inode.data_size));
        }
        builder.end_file();
    }
    if (next != wanted.size()) throw Error(what + ": ended before all its files were read");
}

// True when `from` was renamed, false when it was linked (and is still there).
bool rename_without_replacing(const std::filesystem::path& from, const std::filesystem::path& to) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
        return true;
    }
    if (errno == EEXIST) throw Error("File already exists: " + to.string());
    if (errno != EINVAL && errno != ENOSYS)
        throw system_error("cannot rename the image to " + to.string());
    // Filesystems without RENAME_NOREPLACE: link() never replaces either.
    if (::link(from.c_str(), to.c_str()) != 0) {
        if (errno == EEXIST) throw Error("File already exists: " + to.string());
        throw system_error("cannot link the image to " + to.string());
    }
    return false;
}

// Both passes over the layers, in the confined reader: the tree from their headers, then the
// surviving files' data into the image open at `image_fd`.
void write_image(const ImageLayers& image, const std::vector<UniqueFd>& fds, int image_fd,
                 const std::string& image_name, const ImportOptions& options) {
    // Pass 1: the final tree from the headers.
    LayerTree tree;
    for (size_t layer = 0; layer < fds.size(); ++layer) {
        const std::string what = layer_name(image, layer);
        LayerReader reader(fds[layer].get(), what);
        LayerEntry entry;
        for (uint64_t index = 0; reader.next(entry); ++index) tree.apply(entry, layer, index, what);
    }

    // enroot's files, over whatever the image had there.
    const EnrootImageFiles files = make_enroot_image_files(image.config, options.provenance);
    const int64_t now =
        options.source_date_epoch.value_or(static_cast<int64_t>(std::time(nullptr)));
    tree.make_directories(files.working_directory);
    struct Generated {
        const char* path;
        const std::string* content;
    };
    const Generated generated[] = {{"/etc/fstab", &files.fstab},
                                   {"/etc/environment", &files.environment},
                                   {"/etc/rc", &files.rc},
                                   {"/etc/rc.local", &files.rc_local}};
    std::vector<SquashfsInode*> generated_inodes;
    for (const Generated& file : generated) {
        SquashfsInode& inode = tree.add_generated_file(file.path, 0644, file.content->size());
        inode.mtime = now;
        generated_inodes.push_back(&inode);
    }

    // Pass 2: the surviving files' data, layer by layer, into the image.
    SquashfsBuilder builder(image_fd, image_name, {options.compression});
    const auto plan = tree.data_plan(fds.size());
    std::vector<char> buffer(kCopyBlockBytes);
    for (size_t layer = 0; layer < fds.size(); ++layer) {
        write_layer_data(builder, fds[layer].get(), layer_name(image, layer), plan[layer], buffer);
    }
    for (size_t i = 0; i < generated_inodes.size(); ++i) {
        if (generated[i].content->empty()) continue;
        builder.begin_file(*generated_inodes[i]);
        builder.append(generated[i].content->data(), generated[i].content->size());
        builder.end_file();
    }
    builder.finish(tree.root());
}

}  // namespace

std::filesystem::path temporary_path_beside(const std::filesystem::path& output) {
    std::random_device random;
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", random());
    std::filesystem::path directory = output.parent_path();
    if (directory.empty()) directory = ".";
    return directory / ("." + output.filename().string() + "." + suffix + ".tmp");
}

void write_image_from_layers(const ImageLayers& image, const std::filesystem::path& output,
                             const ImportOptions& options) {
    struct stat st {};
    if (::lstat(output.c_str(), &st) == 0) throw Error("File already exists: " + output.string());
    // Everything the reader touches is opened here: it may open nothing itself.
    const std::vector<UniqueFd> fds = open_layers(image);
    const std::filesystem::path temporary = temporary_path_beside(output);
    UniqueFd image_fd(
        ::open(temporary.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644));
    if (!image_fd) throw system_error("writing squashfs image " + temporary.string());
    RemoveOnExit remove_temporary(temporary);

    std::vector<int> reader_fds;
    reader_fds.reserve(fds.size() + 1);
    for (const UniqueFd& fd : fds) reader_fds.push_back(fd.get());
    reader_fds.push_back(image_fd.get());
    const ParserProcessLimits limits{kLayerReaderDataLimitBytes};
    try {
        run_in_parser_process(reader_fds, landlock_abi_version(), limits, [&] {
            write_image(image, fds, image_fd.get(), temporary.string(), options);
        });
    } catch (const ParserProcessDied& e) {
        throw Error(std::string("the image's layers could not be read: ") + e.what());
    }
    image_fd.reset();
    // After a link() fallback the temporary name still exists; the guard removes it.
    if (rename_without_replacing(temporary, output)) remove_temporary.release();
}

}  // namespace sqbox

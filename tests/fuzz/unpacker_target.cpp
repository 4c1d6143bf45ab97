// Image paths and the unpacker on a hostile image: what the confined child does, run in-process.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_targets.h"
#include "image/image_paths.h"
#include "util/errors.h"
#include "util/file_tree.h"
#include "util/unique_fd.h"
#include "warm_up/list_store.h"
#include "warm_up/unpacked_files.h"

namespace sqbox::fuzz {
namespace {

constexpr size_t kMaxPaths = 300;

UnpackedFilesLimits small_limits() {
    UnpackedFilesLimits limits;
    limits.total_bytes = uint64_t{2} << 20;
    limits.file_bytes = uint64_t{512} << 10;
    limits.entries = 256;
    limits.lookups = 5000;
    return limits;
}

// Every path of the image, some spelled the long way round (through "..", "." and symlinks).
std::vector<std::string> image_paths(sqfs* fs) {
    std::vector<std::string> paths;
    walk_image(fs, kMaxPaths, [&](const std::string& path, sqfs_inode&) { paths.push_back(path); });
    const size_t found = paths.size();
    for (size_t i = 0; i < found; ++i) {
        paths.push_back(paths[i] + "/../." + paths[i]);
        paths.push_back("/../" + paths[i] + "/");
    }
    paths.emplace_back(kImageWarmUpListPath);
    return paths;
}

void resolve_all(sqfs* fs, const std::vector<std::string>& paths) {
    size_t lookups_left = 20000;
    for (const std::string& path : paths) {
        std::optional<std::vector<ImagePathStep>> steps =
            resolve_image_path(fs, path, &lookups_left);
        if (steps && image_path_of(*steps).size() > 4096 + 1) std::abort();  // the kernel's bound
    }
}

// Unpacks `names` (or the image's own list) into a fresh entry, checks it as the launcher would
// and removes it.
void unpack(sqfs* fs, const std::vector<WarmUpName>& names) {
    static std::atomic<unsigned> counter{0};
    const std::string entry = scratch_directory() + "/entry-" + std::to_string(::getpid()) + "-" +
                              std::to_string(counter++);
    if (::mkdir(entry.c_str(), 0700) != 0) std::abort();
    {
        UniqueFd entry_fd(::open(entry.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!entry_fd) std::abort();
        const UnpackedFilesLimits limits = small_limits();
        try {
            unpack_image_files(fs, entry_fd.get(), names, limits);
            (void)check_made_entry(entry, names.empty(), limits);
        } catch (const Error&) {  // a refusal is a fine answer to a hostile image
        }
    }
    remove_tree(entry);  // throws (and the fuzzer stops) if the tree cannot be removed
}

}  // namespace

void image_unpacker(const uint8_t* data, size_t size) {
    std::optional<ImageSource> image = open_fuzz_image(data, size);
    if (!image) return;
    sqfs* fs = &image->squashfs->fs;
    const std::vector<std::string> paths = image_paths(fs);
    resolve_all(fs, paths);
    (void)load_image_warm_up_list(fs);
    unpack(fs, {});
    std::vector<WarmUpName> names;
    for (const std::string& path : paths) names.push_back({path, WarmUpKind::kRead});
    unpack(fs, names);
}

}  // namespace sqbox::fuzz

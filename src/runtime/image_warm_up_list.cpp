#include "runtime/image_warm_up_list.h"

#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include "image/warm_up_store.h"
#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

ImageWarmUpList::ImageWarmUpList(const SandboxConfig& config, const ImageSource& image,
                                 SandboxPlan& plan)
    : image_(config.image) {
    if (image.kind != ImageSource::Kind::kSquashfs) {
        if (config.learn_warm_up) {
            throw Error("--learn-warm-up: " + config.image +
                        " is a directory; warm-up lists are for .sqsh images");
        }
        return;
    }
    if (config.warm_up_directory.empty()) {
        if (config.learn_warm_up) {
            throw Error(
                "--learn-warm-up: no place for the list: set SQBOX_CACHE_DIR, XDG_CACHE_HOME or "
                "HOME");
        }
        return;
    }
    if (config.learn_warm_up) {
        path_ = config.warm_up_directory + "/" + warm_up_list_name(image.file.get());
        records_.reset(::memfd_create("sqbox-warm-up", MFD_CLOEXEC));
        if (!records_) throw system_error("--learn-warm-up: memfd_create");
        plan.learn_fd = records_.get();
    }
    if (!config.use_warm_up_list) return;
    try {
        if (path_.empty()) {
            path_ = config.warm_up_directory + "/" + warm_up_list_name(image.file.get());
        }
        std::optional<std::vector<WarmUpName>> loaded = load_warm_up_list(path_);
        if (!loaded) {
            if (config.verbose) {
                print_error("warm-up: " + path_ + " is not a warm-up list; ignored");
            }
            return;
        }
        names_ = std::move(*loaded);
    } catch (const Error& e) {
        if (config.verbose) print_error(std::string("warm-up: ") + e.what() + "; no list used");
        return;
    }
    if (config.verbose) {
        print_error(names_.empty()
                        ? "warm-up: no list for this image yet (" + path_ +
                              "; sqbox run --learn-warm-up makes one)"
                        : "warm-up: " + std::to_string(names_.size()) + " names from " + path_);
    }
}

void ImageWarmUpList::save_learned() {
    if (!records_) return;
    if (::lseek(records_.get(), 0, SEEK_SET) != 0) throw system_error("--learn-warm-up: lseek");
    const std::vector<WarmUpName> learned =
        decode_warm_up_records(read_all(records_.get(), "the image server's records"));
    const SavedWarmUpList saved = add_to_warm_up_list(path_, learned);
    print_error("warm-up list of " + image_ + ": " + std::to_string(saved.names) + " names (" +
                std::to_string(saved.added) + " new), saved in " + path_);
}

}  // namespace sqbox

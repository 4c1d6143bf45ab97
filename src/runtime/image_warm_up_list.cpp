#include "runtime/image_warm_up_list.h"

#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include "image/hot_files.h"
#include "image/squashfuse_api.h"
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
    if (config.warm_up_directory.empty() && config.learn_warm_up) {
        throw Error(
            "--learn-warm-up: no place for the list: set SQBOX_CACHE_DIR, XDG_CACHE_HOME or HOME");
    }
    if (!config.warm_up_directory.empty()) {
        key_ = warm_up_list_name(image.file.get());
        path_ = config.warm_up_directory + "/" + key_;
    }
    if (config.learn_warm_up) {
        records_.reset(::memfd_create("sqbox-warm-up", MFD_CLOEXEC));
        if (!records_) throw system_error("--learn-warm-up: memfd_create");
        plan.learn_fd = records_.get();
    }
    if (!config.use_warm_up_list) return;
    if (!path_.empty()) load_learned_list(config.verbose);
    // A learning run reads everything through the image server, which records what it reads. A
    // container's persistent layer is never stacked on unpacked files (rootfs.cpp says why).
    if (!path_.empty() && !config.learn_warm_up && config.persistent_layer.empty()) {
        use_hot_files(config, image, plan);
    }
    if (config.verbose && names_.empty() && !path_.empty()) {
        print_error("warm-up: no list for this image yet (" + path_ +
                    "; sqbox run --learn-warm-up makes one)");
    }
}

void ImageWarmUpList::load_learned_list(bool verbose) {
    try {
        std::optional<std::vector<WarmUpName>> loaded = load_warm_up_list(path_);
        if (!loaded) {
            if (verbose) print_error("warm-up: " + path_ + " is not a warm-up list; ignored");
            return;
        }
        names_ = std::move(*loaded);
    } catch (const Error& e) {
        if (verbose) print_error(std::string("warm-up: ") + e.what() + "; no list used");
        return;
    }
    if (verbose && !names_.empty()) {
        print_error("warm-up: " + std::to_string(names_.size()) + " names from " + path_);
    }
}

void ImageWarmUpList::use_hot_files(const SandboxConfig& config, const ImageSource& image,
                                    SandboxPlan& plan) {
    const bool learned = !names_.empty();
    HotFiles hot;
    try {
        hot = prepare_hot_files(&image.squashfs->fs, image.file.get(), config.warm_up_directory,
                                key_, names_);
    } catch (const Error& e) {
        // A cache never fails a run: the sandbox reads those files from the image instead.
        if (config.verbose) print_error(std::string("warm-up: files not unpacked: ") + e.what());
        return;
    }
    if (!learned && !hot.image_names.empty()) {
        names_ = std::move(hot.image_names);
        if (config.verbose) {
            print_error("warm-up: " + std::to_string(names_.size()) + " names from the image's " +
                        kImageWarmUpListPath + " (none learned yet)");
        }
    }
    if (config.verbose && !hot.failure.empty()) {
        print_error("warm-up: files not unpacked: " + hot.failure);
    } else if (config.verbose && hot.tree_fd) {
        print_error("warm-up: " + std::to_string(hot.files) + " files (" +
                    std::to_string(hot.bytes) + " bytes) " + (hot.made ? "unpacked in " : "from ") +
                    hot.tree);
    }
    if (!hot.tree_fd) return;
    tree_fd_ = std::move(hot.tree_fd);
    plan.hot_files_tree = hot.tree;
    plan.hot_files_fd = tree_fd_.get();
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

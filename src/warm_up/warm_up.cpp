#include "warm_up/warm_up.h"

#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include "image/squashfuse_api.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/user_directories.h"
#include "warm_up/learning_recorder.h"
#include "warm_up/list_store.h"
#include "warm_up/unpacked_files.h"

namespace sqbox {

WarmUp::WarmUp(const SandboxConfig& config, const ImageSource& image) : image_(config.image) {
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
    }
    if (!config.use_warm_up_list) return;
    if (!path_.empty()) load_learned_list(config.verbose);
    // A learning run reads everything through the image server, which records what it reads. A
    // container's persistent layer is never stacked on unpacked files (rootfs.cpp says why).
    if (!path_.empty() && !config.learn_warm_up && config.persistent_layer.empty()) {
        use_unpacked_files(config, image);
    }
    if (config.verbose && names_.empty() && !path_.empty()) {
        print_error("warm-up: no list for this image yet (" + path_ +
                    "; sqbox run --learn-warm-up makes one)");
    }
}

void WarmUp::load_learned_list(bool verbose) {
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

void WarmUp::use_unpacked_files(const SandboxConfig& config, const ImageSource& image) {
    const bool learned = !names_.empty();
    UnpackedFiles unpacked;
    try {
        unpacked = prepare_unpacked_files(&image.squashfs->fs, image.file.get(),
                                          config.warm_up_directory, key_, names_);
    } catch (const Error& e) {
        // A cache never fails a run: the sandbox reads those files from the image instead.
        if (config.verbose) print_error(std::string("warm-up: files not unpacked: ") + e.what());
        return;
    }
    if (!learned && !unpacked.image_names.empty()) {
        names_ = std::move(unpacked.image_names);
        if (config.verbose) {
            print_error("warm-up: " + std::to_string(names_.size()) + " names from the image's " +
                        kImageWarmUpListPath + " (none learned yet)");
        }
    }
    if (config.verbose && !unpacked.failure.empty()) {
        print_error("warm-up: files not unpacked: " + unpacked.failure);
    } else if (config.verbose && unpacked.tree_fd) {
        print_error("warm-up: " + std::to_string(unpacked.files) + " files (" +
                    std::to_string(unpacked.bytes) + " bytes) " +
                    (unpacked.made ? "unpacked in " : "from ") + unpacked.tree);
    }
    if (!unpacked.tree_fd) return;
    unpacked_files_.fd = std::move(unpacked.tree_fd);
    unpacked_files_.tree = unpacked.tree;
}

void WarmUp::save_learned() {
    if (!records_) return;
    if (::lseek(records_.get(), 0, SEEK_SET) != 0) throw system_error("--learn-warm-up: lseek");
    const std::vector<WarmUpName> learned =
        decode_warm_up_records(read_all(records_.get(), "the image server's records"));
    const SavedWarmUpList saved = add_to_warm_up_list(path_, learned);
    print_error("warm-up list of " + image_ + ": " + std::to_string(saved.names) + " names (" +
                std::to_string(saved.added) + " new), saved in " + path_);
}

std::string default_warm_up_directory() {
    const std::string cache = sqbox_cache_directory();
    return cache.empty() ? cache : cache + "/warm-up";
}

std::unique_ptr<ImageAccessRecorder> make_learning_recorder(int learn_fd) {
    if (learn_fd < 0) return nullptr;
    return std::make_unique<LearningRecorder>(learn_fd);
}

}  // namespace sqbox

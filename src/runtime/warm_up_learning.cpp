#include "runtime/warm_up_learning.h"

#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include "util/errors.h"
#include "util/files.h"

namespace sqbox {

WarmUpLearning::WarmUpLearning(const SandboxConfig& config, const ImageSource& image,
                               SandboxPlan& plan)
    : image_(config.image) {
    if (image.kind != ImageSource::Kind::kSquashfs) {
        if (config.learn_warm_up) {
            throw Error("--learn-warm-up: " + config.image +
                        " is a directory; warm-up lists are for .sqsh images");
        }
        return;
    }
    if (!config.use_warm_up_list && !config.learn_warm_up) return;
    const std::string directory = warm_up_directory();
    if (directory.empty()) {
        if (config.learn_warm_up) {
            throw Error(
                "--learn-warm-up: no place for the list: set SQBOX_CACHE_DIR, XDG_CACHE_HOME or "
                "HOME");
        }
        return;
    }
    path_ = directory + "/" + warm_up_list_name(image.file.get());
    std::optional<std::vector<WarmUpName>> loaded;
    try {
        loaded = load_warm_up_list(path_);
        if (!loaded && config.verbose) {
            print_error("warm-up: " + path_ + " is not a warm-up list; ignored");
        }
    } catch (const Error& e) {
        if (config.verbose) print_error(std::string("warm-up: ") + e.what() + "; ignored");
    }
    if (loaded) known_ = std::move(*loaded);
    if (config.use_warm_up_list) {
        plan.warm_up_names = known_;
        if (config.verbose) {
            print_error(known_.empty()
                            ? "warm-up: no list for this image yet (" + path_ +
                                  "; sqbox run --learn-warm-up makes one)"
                            : "warm-up: " + std::to_string(known_.size()) + " names from " + path_);
        }
    }
    if (config.learn_warm_up) {
        records_.reset(::memfd_create("sqbox-warm-up", MFD_CLOEXEC));
        if (!records_) throw system_error("--learn-warm-up: memfd_create");
        plan.learn_fd = records_.get();
    }
}

void WarmUpLearning::save() {
    if (!records_) return;
    if (::lseek(records_.get(), 0, SEEK_SET) != 0) throw system_error("--learn-warm-up: lseek");
    const std::vector<WarmUpName> learned =
        decode_warm_up_records(read_all(records_.get(), "the image server's records"));
    const size_t before = known_.size();
    const std::vector<WarmUpName> merged = merge_warm_up_names(std::move(known_), learned);
    known_.clear();
    save_warm_up_list(path_, merged);
    print_error("warm-up list of " + image_ + ": " + std::to_string(merged.size()) + " names (" +
                std::to_string(merged.size() - before) + " new), saved in " + path_);
}

}  // namespace sqbox

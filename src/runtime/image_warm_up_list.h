// The launcher's side of an image's warm-up list (image/warm_up_list.h, image/warm_up_store.h):
// finding and loading it before the sandbox starts and, after a learning run, adding what the
// image server recorded.
#pragma once

#include <string>
#include <vector>

#include "image/image_source.h"
#include "image/warm_up_list.h"
#include "runtime/sandbox_plan.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

class ImageWarmUpList {
  public:
    // Loads the list of `image` (a .sqsh only) from config.warm_up_directory, or the list the
    // image carries if the caller has learned none, unless config.use_warm_up_list is off. A
    // list that cannot be read or is not one is ignored: a cache never fails a run (--verbose
    // says why). With a list (not in a learning run, not under a container's persistent layer),
    // the files it reads are unpacked into the list directory, once per image file and list
    // (image/hot_files.h), and plan.hot_files_tree names them. A learning run also gets the
    // server's record file (plan.learn_fd). Throws Error for a learning run that cannot learn (a
    // directory image, no directory for lists).
    ImageWarmUpList(const SandboxConfig& config, const ImageSource& image, SandboxPlan& plan);

    // The names the supervisor looks up ahead of the payload.
    const std::vector<WarmUpName>& names() const { return names_; }

    // A learning run, once the sandbox is gone: adds what the server recorded to the list, with
    // one line on stderr saying where. Throws Error if it cannot be saved.
    void save_learned();

  private:
    // The caller's learned list (path_), or the image's own (kImageWarmUpListPath) while there
    // is none. Either, unreadable or not a list, is only said with --verbose: a cache never
    // fails a run.
    void load_learned_list(bool verbose);
    void load_image_list(bool verbose, const ImageSource& image);
    // Unpacks the files the list reads (image/hot_files.h) and puts them in the plan.
    void use_hot_files(const SandboxConfig& config, const ImageSource& image,
                       SandboxPlan& plan) const;

    std::string image_;
    std::string key_;
    std::string path_;
    std::vector<WarmUpName> names_;
    UniqueFd records_;
};

}  // namespace sqbox

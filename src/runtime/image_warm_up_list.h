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
    // Loads the caller's list of `image` (a .sqsh only) from config.warm_up_directory, unless
    // config.use_warm_up_list is off. A list that cannot be read or is not one is ignored: a
    // cache never fails a run (--verbose says why). Except in a learning run or under a
    // container's persistent layer, it then prepares the image's entry there
    // (image/hot_files.h): the files of the list unpacked, and while the caller has learned no
    // list, the image's own list, which is then the one used; plan.hot_files_tree and
    // plan.hot_files_fd name the unpacked files. A learning run also gets the server's record
    // file (plan.learn_fd). Throws Error for a learning run that cannot learn (a directory
    // image, no directory for lists).
    ImageWarmUpList(const SandboxConfig& config, const ImageSource& image, SandboxPlan& plan);

    // The names the supervisor looks up ahead of the payload.
    const std::vector<WarmUpName>& names() const { return names_; }

    // A learning run, once the sandbox is gone: adds what the server recorded to the list, with
    // one line on stderr saying where. Throws Error if it cannot be saved.
    void save_learned();

  private:
    // The caller's learned list (path_); unreadable or not a list, it is only said with
    // --verbose.
    void load_learned_list(bool verbose);
    // The image's entry (image/hot_files.h) into the plan, and the image's own list into names_
    // while the caller has learned none.
    void use_hot_files(const SandboxConfig& config, const ImageSource& image, SandboxPlan& plan);

    std::string image_;
    std::string key_;
    std::string path_;
    std::vector<WarmUpName> names_;
    UniqueFd records_;
    UniqueFd tree_fd_;  // plan.hot_files_fd, open until the sandbox is gone
};

}  // namespace sqbox

// The launcher's side of an image's learned warm-up list (image/warm_up_list.h): loading the list
// into the plan before the sandbox starts and, after a learning run, saving what the image server
// recorded.
#pragma once

#include <string>
#include <vector>

#include "image/image_source.h"
#include "image/warm_up_list.h"
#include "runtime/sandbox_plan.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

class WarmUpLearning {
  public:
    // Finds the list of `image` (a .sqsh only) and puts its names in plan.warm_up_names, unless
    // config.use_warm_up_list is off. A list that cannot be read or is not one is ignored (a
    // cache never fails a run; --verbose says so). A learning run also gets the server's record
    // file (plan.learn_fd). Throws Error for a learning run that cannot learn (a directory image,
    // no cache directory).
    WarmUpLearning(const SandboxConfig& config, const ImageSource& image, SandboxPlan& plan);

    // A learning run, once the sandbox is gone: adds what the server recorded to the list and
    // saves it, with one line on stderr saying where. Throws Error if it cannot be saved.
    void save();

  private:
    std::string image_;
    std::string path_;
    std::vector<WarmUpName> known_;
    UniqueFd records_;
};

}  // namespace sqbox

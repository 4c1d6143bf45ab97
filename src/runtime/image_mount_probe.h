// Whether the image server answers at all. A killed process whose request the server has taken,
// or whose look-up waits behind another's of the same name, cannot die until that request is
// answered; so a sandbox still there after its timeout's kill may be held by a server that has
// stalled (a parser spinning on a hostile image). A probe tells a stalled server from a busy one:
// a child asks the mount for a statfs, which a live server answers once it gets to it, however
// long its queue, and a stalled one never does.
#pragma once

#include <chrono>
#include <csignal>
#include <functional>

#include "util/process.h"
#include "util/unique_fd.h"

namespace sqbox {

// How long a probe may go unanswered before its server counts as stalled: longer than any queue
// of requests a live server works through.
constexpr std::chrono::seconds kStalledServerVerdict{5};

class ImageMountProbe {
  public:
    // Starts the probe of the mount at /image; false (no verdict to be had) if no child could be
    // made.
    bool start();
    [[nodiscard]] bool running() const { return child_.running(); }
    // Readable once the probe has been answered.
    [[nodiscard]] int exit_fd() const { return exit_.get(); }
    // Whether it has been answered (the child reaped then); never blocks.
    bool answered();
    // Kills it; it is reaped by answered() once its request has failed.
    void stop() const { child_.send(SIGKILL); }

  private:
    ChildProcess child_;
    UniqueFd exit_;
};

// The run supervisor's verdict: if a probe goes unanswered for kStalledServerVerdict, calls
// `end_server` (before the probe is reaped: its request fails with the server) and returns true.
bool end_image_server_if_stalled(const std::function<void()>& end_server);

}  // namespace sqbox

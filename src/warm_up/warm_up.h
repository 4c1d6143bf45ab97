// The warm-up of a .sqsh image, as the rest of sqbox uses it: the one header of src/warm_up that
// the launch pipeline and the command line include.
//
// The words, as README's "Warm-up lists" uses them:
//  - a warm-up list (warm_up_list.h): the names in an image that learning runs looked up, read
//    and listed, in order; the caller's own per image (list_store.h), or the one the image
//    carries at /etc/sqbox/warm-up;
//  - a learning run (sqbox run --learn-warm-up): the image server records what the payload does
//    (learning_recorder.h), and the launcher adds that to the image's list once the sandbox is
//    gone;
//  - the unpacked files (unpacked_files.h): the files a list reads, unpacked once into the
//    caller's cache and laid read-only above the image;
//  - the look-ahead (look_ahead.h): the supervisor's thread that looks up, ahead of the payload,
//    what every start needs and the list's names.
//
// The launcher makes a WarmUp before the sandbox and hands its parts to the supervisor (the
// names, the learning run's record file, the unpacked files); the supervisor gives the record
// file to the image server (make_learning_recorder), binds the unpacked files and starts the
// look-ahead; the launcher calls save_learned() once the sandbox is gone.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "image/image_source.h"
#include "image/squashfs_server.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"
#include "warm_up/look_ahead.h"
#include "warm_up/warm_up_list.h"

namespace sqbox {

// The image's unpacked files as the supervisor binds them: the directory on the host, and an
// O_PATH descriptor of it taken when its stamp was checked, which the bind must match (another
// run may replace the directory meanwhile). Empty if there are none.
struct UnpackedFilesHandle {
    std::string tree;
    UniqueFd fd;
};

class WarmUp {
  public:
    // Loads the caller's list of `image` (a .sqsh only) from config.warm_up_directory, unless
    // config.use_warm_up_list is off. A list that cannot be read or is not one is ignored: a
    // cache never fails a run (--verbose says why). Except in a learning run or under a
    // container's persistent layer, it then prepares the image's entry there
    // (warm_up/unpacked_files.h): the files of the list unpacked and, while the caller has
    // learned no list, the image's own list, which is then the one used. A learning run also
    // gets the server's record file. Throws Error for a learning run that cannot learn (a
    // directory image, no directory for lists).
    WarmUp(const SandboxConfig& config, const ImageSource& image);

    // The names the supervisor looks up ahead of the payload.
    const std::vector<WarmUpName>& names() const { return names_; }

    // In the supervisor, whose memory is a copy of the launcher's: takes what it hands on. The
    // record file of a learning run, for the image server (make_learning_recorder), and the
    // image's unpacked files, for its bind (none of either if there are none). The launcher's
    // own copies stay in its object, which reads the records once the sandbox is gone.
    UniqueFd take_learn_records() { return std::move(records_); }
    UnpackedFilesHandle take_unpacked_files() { return std::move(unpacked_files_); }

    // A learning run, once the sandbox is gone: adds what the server recorded to the list, with
    // one line on stderr saying where. Throws Error if it cannot be saved.
    void save_learned();

  private:
    // The caller's learned list (path_); unreadable or not a list, it is only said with
    // --verbose.
    void load_learned_list(bool verbose);
    // The image's entry (warm_up/unpacked_files.h), and the image's own list into names_ while
    // the caller has learned none.
    void use_unpacked_files(const SandboxConfig& config, const ImageSource& image);

    std::string image_;
    std::string key_;
    std::string path_;
    std::vector<WarmUpName> names_;
    UniqueFd records_;
    UnpackedFilesHandle unpacked_files_;
};

// The caller's directory for warm-up lists: sqbox_cache_directory() + "/warm-up", "" if there is
// none (what SandboxConfig::warm_up_directory is set to).
std::string default_warm_up_directory();

// The image server's recorder for a learning run whose record file is `learn_fd` (kept open by
// the caller while the server runs); null when `learn_fd` is -1 (not learning).
std::unique_ptr<ImageAccessRecorder> make_learning_recorder(int learn_fd);

}  // namespace sqbox

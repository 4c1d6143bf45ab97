// The files enroot 4.x's import writes into every image it makes from an image configuration
// (its docker::configure): /etc/rc runs the ENTRYPOINT and CMD in the working directory,
// /etc/environment holds Env, /etc/fstab turns Volumes into bind mounts and /etc/rc.local is the
// user's hook. Same bytes as enroot's, so enroot and sqbox treat the result alike.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sqbox {

struct EnrootImageFiles {
    std::string rc;                 // /etc/rc
    std::string rc_local;           // /etc/rc.local
    std::string environment;        // /etc/environment
    std::string fstab;              // /etc/fstab
    std::string working_directory;  // created in the image if missing ("/" when unset)
};

// `config`: the image configuration (OCI or Docker); `provenance`: the URI for the rc's first line.
EnrootImageFiles make_enroot_image_files(const nlohmann::json& config,
                                         const std::string& provenance);

// bash's ${word@Q}: the word single-quoted for reuse as shell input ($'...' with escapes when it
// holds control characters).
std::string bash_quote(const std::string& word);

}  // namespace sqbox

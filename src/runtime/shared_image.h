// The shared image server: one image server per user, image file and sqbox binary that outlives
// the sandbox that started it, for as long as any sandbox uses it and an idle time after. Every
// sandbox of the image mounts a copy of its one FUSE mount, so the image's decompressed pages and
// looked-up names stay in the kernel's caches from one sandbox to the next; a mount of a sandbox's
// own starts cold every time (bench/README.md, "Where a cold start goes"). SECURITY.md, "The
// shared image server", says why no sandbox can change what another sees through it.
#pragma once

#include <optional>

#include "image/image_source.h"
#include "sqbox/config.h"
#include "util/unique_fd.h"

namespace sqbox {

// A sandbox's hold on the shared image server.
struct SharedImage {
    // Open for as long as the sandbox lives: the server stays while any sandbox holds one.
    UniqueFd connection;
    // A detached copy (open_tree) of the server's mount of the image, for the supervisor to attach.
    UniqueFd mount;
};

// The shared mount of `image` (a .sqsh), starting its server first if none runs. nullopt when
// config.image_server_idle_seconds is 0, or where no shared server can be had (its name held by
// a socket not of this user's server, a server that failed to start or to answer): the sandbox
// then serves the image itself, and config.verbose says why.
std::optional<SharedImage> share_image(const ImageSource& image, const SandboxConfig& config);

// `sqbox image-server --socket @NAME --idle SECONDS`, which share_image starts (never a user):
// with the image on descriptor 3 and its socket, listening on the abstract name NAME, on 4,
// starts the server in a user and mount namespace of its own and returns.
int serve_shared_image(const std::string& socket_name, unsigned idle_seconds);

// The supervisor, in its new mount namespace: moves to the scratch root (rootfs.h) and attaches
// the shared mount at /image.
void attach_shared_image(UniqueFd mount);

// The supervisor: SIGIO (blocked, for wait_for_signal) when the server says something on
// `connection`, which it does only when its image server has died.
void signal_when_shared_server_speaks(int connection);

// The image server's wait status, if the server has said that it died (or, as SIGKILL, if the
// server itself is gone); nullopt while it serves. Waits up to `wait_ms` for the word.
std::optional<int> shared_server_death(int connection, int wait_ms);

// The supervisor, once init has ended: shared_server_death, waiting for the word only if the
// image's mount has lost its server.
std::optional<int> shared_server_death_at_end(int connection);

// The supervisor of a killed sandbox that a stalled shared server holds: asks the server to end
// its image server. That fails every request the image server held, so the sandbox ends, and so
// does every other sandbox of the image then running, each with the usual line on the server's
// death (SECURITY.md, "The shared image server").
void report_stalled_shared_server(int connection);

}  // namespace sqbox

// The image server opens files with no message (FileOpens::kWithoutMessages: no OPEN, no RELEASE,
// a round trip less for each file a payload opens), so until one FLUSH has been refused each close
// of a file of the image sends FLUSH and waits for its answer, without end and deaf to SIGKILL.
// Such a close must never be made by the image server itself: killed (a crash on a corrupt image,
// its owner's end) while its read-ahead thread holds files of the mount, its last thread closes
// them as it exits and waits for an answer only the dying process could give, and neither it nor
// its connection nor the sandboxes on it ever end (as
// test_sandboxes_whose_init_fails_at_once_always_end saw of a server's own before FOPEN_NOFLUSH).
#pragma once

#include <string>

namespace sqbox {

// Opens and closes one regular file of the image mounted at `image_dir`: the image server refuses
// that FLUSH, and the kernel sends FLUSH on the connection no more (a flag of the connection,
// shared by every copy of the mount). Call it before anything else holds a file of the mount: the
// read-ahead thread opens files only after reads, which this makes none of. Never from the image
// server; and the caller must see that the close cannot wait for good: either it holds no
// /dev/fuse of the connection (should the server die meanwhile, the connection goes with it and
// the close returns), or whoever holds one answers the request a dead server took (sqbox serve:
// session/warm_supervisor.cpp). The file is /etc/passwd where that is one, else found by a
// bounded walk, breadth first, opening directories lazily (an image's root usually holds none;
// /etc many). Throws Error when it finds
// none, or the server is gone.
void stop_fuse_flushes(const std::string& image_dir);

}  // namespace sqbox

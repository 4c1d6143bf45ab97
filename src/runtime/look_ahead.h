// The look-ahead: looking up, ahead of init and the payload, what every start needs from a
// squashfs image.
//
// A fresh FUSE mount knows no names yet, so each first lookup is a round trip to the image server
// in which the sandbox waits. Some are the same for every start: the /etc files sqbox's set-up
// reads, the command's candidates along PATH (the missing ones too: the server lets the kernel
// cache those), glibc's /etc/ld.so.cache and the interpreter the command names (an ELF file's
// dynamic loader, a script's "#!" line). A thread of the supervisor looks those up, and reads
// the first chunk of the ones that are files (which starts the server's read-ahead of the rest),
// while init is still creating namespaces.
//
// The supervisor, not the server: a thread of the server waiting for its own server's answer
// could not be killed (image/squashfs_prefetch.h). The supervisor holds no /dev/fuse descriptor,
// so if the server dies, the connection ends and so does any wait here.
//
// The supervisor's view includes the host (under /oldroot): paths are resolved as in the
// sandbox (openat2 with RESOLVE_IN_ROOT, RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS) on the FUSE
// mount, which is nodev, so an image's symlinks cannot make it open anything of the host.
#pragma once

#include <string>
#include <vector>

#include "sqbox/config.h"

namespace sqbox {

// The paths in the image that a sandbox for `config` looks up first; `default_path` is the
// payload's PATH unless --env sets one.
std::vector<std::string> first_lookups(const SandboxConfig& config,
                                       const std::string& default_path);

// Starts a thread that looks up `paths` (absolute, in the image) on the image mounted at
// `mount_point`, following the interpreters they name, and reads the first chunk of the files.
// The thread is detached: it holds nothing that needs cleaning up, and the process may exit under
// it. Call only once no more processes will be made but by glibc's fork (a raw clone would copy
// its locks held, such as malloc's, into the child), and whose children call only system calls.
// Without a thread to be had, nothing is looked up ahead.
void start_look_ahead(std::string mount_point, std::vector<std::string> paths);

}  // namespace sqbox

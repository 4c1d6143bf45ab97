// The image server parses the image (libsquashfuse), the one input of a run that comes from
// neither sqbox nor the caller. A parser bug turned into code execution there must find nothing
// to use: this is what the server gives up once it holds the image and /dev/fuse.
#pragma once

#include <cstdint>
#include <vector>

namespace sqbox {

// RLIMIT_DATA of the image server (writable private memory: heap, thread stacks, the caches of
// libsquashfuse and of the inode paths). It serves the python test image with about 12 MiB;
// an image of a million files needs some 300 MiB of paths; above that, a cache that big is
// hostile.
inline constexpr uint64_t kImageServerDataLimitBytes = uint64_t{1} << 30;
// RLIMIT_NPROC of the image server: it needs one thread besides its own.
inline constexpr uint64_t kImageServerMaxProcesses = 1024;

// In the image server, right after the fork, before it answers any request; single-threaded
// (the threads it starts later inherit all of it). After this the process
//  - sees a file system of its own: an empty, read-only tmpfs as its root, with only its own
//    FUSE mount at /image (the read-ahead thread opens files there), in a mount namespace of its
//    own; the sandboxes keep seeing the supervisor's mount of the same connection;
//  - holds only `keep_fds` (the image, /dev/fuse) and /dev/null as stdin, stdout and stderr
//    (libfuse's and glibc's messages go nowhere);
//  - has no capability in any set, the bounding set empty, securebits locked, no_new_privs;
//  - may use kImageServerDataLimitBytes of private memory and no shared memory, write no file,
//    start kImageServerMaxProcesses threads, dumps no core;
//  - may make only the system calls of serving (install_image_server_filter).
// Throws Error with the step that failed.
void confine_image_server(const std::vector<int>& keep_fds);

// The seccomp allow-list alone: what libfuse's request loop, libsquashfuse and the read-ahead
// thread use. Anything else kills the whole process (SECCOMP_RET_KILL_PROCESS), so a hijacked
// server dies at its first step outside serving, and the supervisor says so.
void install_image_server_filter();

}  // namespace sqbox

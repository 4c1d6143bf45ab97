// Running sqbox's own work on untrusted input (an image's directory tables, symlinks and files,
// read by libsquashfuse) in a child process that could do little harm if the input took control
// of it: it can touch no file but those beneath one directory (Landlock, where the kernel has
// it), make no TCP connection nor any other system call but those of working with files
// (seccomp), reach no terminal or other descriptor of its parent's, gain no privilege
// (no_new_privs), use a bounded amount of memory and CPU, and is killed when it runs too long or
// when its parent dies.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace sqbox {

struct ConfinedLimits {
    uint64_t address_space_bytes = uint64_t{1} << 30;
    uint64_t file_size_bytes = uint64_t{64} << 20;  // RLIMIT_FSIZE: the largest file it may write
    std::chrono::milliseconds time_limit{10000};
    // It may also create symbolic links (symlinkat) beneath its directory: image/image_unpack.h.
    bool make_symlinks = false;
    // Signals the caller holds blocked whose arrival abandons the work (a user's Ctrl-C during
    // minutes of unpacking): the child is killed and Error thrown, the signal left pending.
    std::optional<sigset_t> stop_signals;
};

// Runs `work` in a confined child whose writable world is the directory open at `directory_fd`,
// and returns what `work` returned (its report, at most 64 KiB). The child keeps no descriptor
// but `directory_fd` and `keep_fds` (its stdin, stdout and stderr are /dev/null, in a session
// of its own, without a terminal), holds no capability (a root caller's child drops them all),
// and may make only the system calls of reading and writing files (seccomp; anything else, a
// new process included, fails with EPERM). Throws Error with the reason if `work` threw (its
// message), or the child died, ran out of time, could not be confined or one of
// `limits.stop_signals` came; without Landlock
// (kernels before 5.13, or disabled) it runs nothing and throws.
std::string run_confined(int directory_fd, const std::vector<int>& keep_fds,
                         const std::function<std::string()>& work,
                         const ConfinedLimits& limits = {});

}  // namespace sqbox

// Running sqbox's own parsers of untrusted data (an imported image's layers: libarchive, its
// decompressors and the squashfs writer) in a child process that confines itself before it reads
// a byte, so that a parser bug turned into code execution finds little to use. Unlike
// security/confined_work.h the child may start threads (the writer compresses in parallel), run
// as long as the work takes and use as much memory as a large image needs; unlike the image
// server it needs no mount namespace, since it opens nothing at all: every input and its output
// are descriptors its parent opened.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/errors.h"

namespace sqbox {

struct ParserProcessLimits {
    uint64_t data_bytes = uint64_t{4} << 30;  // RLIMIT_DATA: heap, thread stacks, private maps
};

// The child died instead of finishing (a signal, the seccomp filter, the memory limit): what()
// says which, ending in "(the reader crashed)" or "(the reader ran out of memory)".
class ParserProcessDied : public Error {
  public:
    using Error::Error;
};

// Runs `work` in a forked child and waits for it. Before `work` starts the child
//  - holds only `keep_fds` (and /dev/null as stdin, stdout and stderr), in a session of its own
//    (no terminal), and dies with its parent;
//  - has no_new_privs, no capability (a root caller's child drops them all), no core dumps, is not
//    dumpable (ptrace, /proc/PID/mem), and `limits.data_bytes` of private memory;
//  - opens no file or directory by path and makes no TCP connection (Landlock where the kernel
//    has it: `landlock_abi` > 0; opening by path is refused by seccomp too);
//  - cannot make the system calls parsing never needs (install_parser_filter).
// Returns when `work` returned. Throws Error with `work`'s own message (one line, as `work` threw
// it) when it threw, ParserProcessDied when the child died otherwise, Error when the child could
// not be started or confined.
void run_in_parser_process(const std::vector<int>& keep_fds, int landlock_abi,
                           const ParserProcessLimits& limits, const std::function<void()>& work);

// The seccomp filter alone (a deny-list: see SECURITY.md for why): no new programs, processes or
// namespaces, no other process's memory or signals, no sockets, no mounts, keys, BPF, perf,
// userfaultfd or io_uring, no shared memory (it would escape RLIMIT_DATA), no opening by path, no
// terminal injection. Threads (clone with CLONE_THREAD) keep working.
void install_parser_filter();

}  // namespace sqbox

// A smaller seccomp program for profiles that mostly list system calls without conditions.
//
// libseccomp dispatches on the call number with a binary tree of comparisons, one leaf per
// listed call: 424 of the 651 instructions of sqbox's default profile. The kernel converts and
// JIT-compiles every instruction each time a sandbox installs its filter, which is most of what
// installing costs (about 0.45 µs per instruction here). Listed calls mostly come in runs of
// consecutive numbers with the same answer, so a binary search over the runs' boundaries answers
// them with one comparison per run (86 runs in the default profile). Calls whose arguments are
// checked keep libseccomp's code.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace sqbox {

struct RangeDispatchParts {
    // libseccomp's program for the calls whose arguments are checked; it answers `sentinel`
    // wherever the profile has no rule for the call (every other call among them).
    std::vector<sock_filter> conditional;
    uint32_t sentinel = 0;
    // Every other listed call of the native architecture: number -> answer.
    std::map<uint32_t, uint32_t> plain_answers;
    // The answer to calls the profile does not list.
    uint32_t default_answer = 0;
};

// `conditional` with each `ret sentinel` turned into a jump to a search over the plain calls'
// runs. nullopt when a jump would not fit classic BPF's 8-bit offsets, or `conditional` never
// answers `sentinel`.
std::optional<std::vector<sock_filter>> build_range_dispatch(const RangeDispatchParts& parts);

// Turns each `ret sentinel` of `code` into a jump to its end, where the caller appends what answers
// next. Returns false when `code` never answers `sentinel`.
bool continue_at_sentinel(std::vector<sock_filter>& code, uint32_t sentinel);

// Values from `start` up to the next run's start (the last run: up to 2^32 - 1) get `answer`.
struct AnswerRun {
    uint32_t start = 0;
    uint32_t answer = 0;
    bool operator==(const AnswerRun&) const = default;
};

// Appends to `code` a binary search that answers the 32-bit value in the accumulator by the
// run it falls in: one comparison per run boundary, then one `ret` per distinct answer. `runs`
// must start at 0, ascending. Returns false when a jump would not fit classic BPF's 8-bit
// offsets.
bool append_run_search(std::vector<sock_filter>& code, const std::vector<AnswerRun>& runs);

}  // namespace sqbox

#include "security/seccomp_range_dispatch.h"

#include <linux/seccomp.h>

#include <cstddef>
#include <limits>

namespace sqbox {
namespace {

std::vector<AnswerRun> runs_of(const std::map<uint32_t, uint32_t>& plain, uint32_t default_answer) {
    std::vector<AnswerRun> runs;
    auto add = [&runs](uint32_t start, uint32_t answer) {
        if (runs.empty() || runs.back().answer != answer) runs.push_back({start, answer});
    };
    uint64_t next = 0;  // the first number after those placed so far
    for (const auto& [number, answer] : plain) {
        if (number > next) add(static_cast<uint32_t>(next), default_answer);
        add(number, answer);
        next = uint64_t{number} + 1;
    }
    if (next <= std::numeric_limits<uint32_t>::max()) {
        add(static_cast<uint32_t>(next), default_answer);
    }
    return runs;
}

// Emits the search: each comparison sends numbers at or above a run's start one way, the rest
// the other, until one run is left, whose answer is a shared `ret`. Comparisons come before
// what they jump to (classic BPF only jumps forward).
class SearchEmitter {
  public:
    explicit SearchEmitter(std::vector<sock_filter>& code) : code_(code) {}

    // Returns false when an offset does not fit.
    bool emit(const std::vector<AnswerRun>& runs) {
        // A single run needs no comparison: its `ret`, emitted next, answers.
        (void)subtree(runs, 0, runs.size() - 1);
        for (const AnswerRun& run : runs) {
            if (ret_at_.count(run.answer) == 0) {
                ret_at_[run.answer] = code_.size();
                code_.push_back(BPF_STMT(BPF_RET | BPF_K, run.answer));
            }
        }
        for (const Fixup& fixup : fixups_) {
            const size_t target =
                fixup.target.is_answer ? ret_at_.at(fixup.target.answer) : fixup.target.insn;
            const size_t offset = target - (fixup.insn + 1);
            if (offset > std::numeric_limits<uint8_t>::max()) return false;
            sock_filter& insn = code_[fixup.insn];
            (fixup.taken ? insn.jt : insn.jf) = static_cast<uint8_t>(offset);
        }
        return true;
    }

  private:
    // A shared `ret answer`, or the instruction at index `insn`.
    struct Target {
        bool is_answer = false;
        uint32_t answer = 0;
        size_t insn = 0;
    };
    // Which offset of the comparison at `insn` goes to `target`.
    struct Fixup {
        size_t insn = 0;
        bool taken = true;
        Target target;
    };

    Target subtree(const std::vector<AnswerRun>& runs, size_t first, size_t last) {
        if (first == last) return {true, runs[first].answer, 0};
        const size_t middle = first + (last - first + 1) / 2;
        const size_t insn = code_.size();
        code_.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, runs[middle].start, 0, 0));
        const Target below = subtree(runs, first, middle - 1);
        const Target above = subtree(runs, middle, last);
        fixups_.push_back({insn, false, below});
        fixups_.push_back({insn, true, above});
        return {false, 0, insn};
    }

    std::vector<sock_filter>& code_;
    std::vector<Fixup> fixups_;
    std::map<uint32_t, size_t> ret_at_;
};

}  // namespace

bool continue_at_sentinel(std::vector<sock_filter>& code, uint32_t sentinel) {
    bool seen = false;
    for (size_t i = 0; i < code.size(); ++i) {
        sock_filter& insn = code[i];
        if (insn.code == (BPF_RET | BPF_K) && insn.k == sentinel) {
            insn = BPF_JUMP(BPF_JMP | BPF_JA, static_cast<uint32_t>(code.size() - (i + 1)), 0, 0);
            seen = true;
        }
    }
    return seen;
}

bool append_run_search(std::vector<sock_filter>& code, const std::vector<AnswerRun>& runs) {
    SearchEmitter search(code);
    return search.emit(runs);
}

std::optional<std::vector<sock_filter>> build_range_dispatch(const RangeDispatchParts& parts) {
    std::vector<sock_filter> code = parts.conditional;
    if (!continue_at_sentinel(code, parts.sentinel)) return std::nullopt;
    code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
    if (!append_run_search(code, runs_of(parts.plain_answers, parts.default_answer))) {
        return std::nullopt;
    }
    return code;
}

}  // namespace sqbox

#include "security/seccomp_argument_ranges.h"

#include <linux/seccomp.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <set>

#include "security/seccomp_range_dispatch.h"

namespace sqbox {
namespace {

constexpr uint32_t kWordMax = std::numeric_limits<uint32_t>::max();

uint32_t high_word(uint64_t value) {
    return static_cast<uint32_t>(value >> 32);
}
uint32_t low_word(uint64_t value) {
    return static_cast<uint32_t>(value);
}

uint32_t word_offset(unsigned arg, bool high) {
    const auto base = static_cast<uint32_t>(offsetof(seccomp_data, args) + size_t{8} * arg);
    constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
    return base + (high == kLittleEndian ? 4 : 0);
}

// Low words from `first` to `last`, both included.
struct WordRange {
    uint32_t first = 0;
    uint32_t last = 0;
};
using WordRanges = std::vector<WordRange>;

// A mask of leading ones (0, 0xffffff00, 0xffffffff): (x & mask) == v is then a range of x.
bool leading_ones(uint32_t mask) {
    const uint32_t rest = ~mask;
    return (rest & (rest + 1)) == 0;
}

// The high words `check` compares the argument's high word with; nullopt when the test is not a
// range of values (a MASKED_EQ mask that is neither all nor none of the high word, or not leading
// ones in the low word; an operator of its own).
std::optional<std::vector<uint32_t>> compared_high_words(const scmp_arg_cmp& check) {
    switch (check.op) {
        case SCMP_CMP_EQ:
        case SCMP_CMP_NE:
        case SCMP_CMP_LT:
        case SCMP_CMP_LE:
        case SCMP_CMP_GT:
        case SCMP_CMP_GE:
            return std::vector<uint32_t>{high_word(check.datum_a)};
        case SCMP_CMP_MASKED_EQ: {
            const uint32_t mask_high = high_word(check.datum_a);
            if (!leading_ones(low_word(check.datum_a))) return std::nullopt;
            if (mask_high == 0) return std::vector<uint32_t>{};
            if (mask_high == kWordMax) return std::vector<uint32_t>{high_word(check.datum_b)};
            return std::nullopt;
        }
        default:
            return std::nullopt;
    }
}

// The low words for which `check` holds when the high word is `high`, a word that is either one
// the check compares with or, for the whole class it stands for, on the same side of it.
WordRanges holding_low_words(const scmp_arg_cmp& check, uint32_t high) {
    WordRanges all = {{0, kWordMax}};
    WordRanges none;
    const uint32_t value_high = high_word(check.datum_a);
    const uint32_t value_low = low_word(check.datum_a);
    switch (check.op) {
        case SCMP_CMP_EQ:
            return high == value_high ? WordRanges{{value_low, value_low}} : none;
        case SCMP_CMP_NE: {
            if (high != value_high) return all;
            WordRanges ranges;
            if (value_low > 0) ranges.push_back({0, value_low - 1});
            if (value_low < kWordMax) ranges.push_back({value_low + 1, kWordMax});
            return ranges;
        }
        case SCMP_CMP_LT:
            if (high != value_high) return high < value_high ? all : none;
            return value_low == 0 ? none : WordRanges{{0, value_low - 1}};
        case SCMP_CMP_LE:
            if (high != value_high) return high < value_high ? all : none;
            return {{0, value_low}};
        case SCMP_CMP_GT:
            if (high != value_high) return high > value_high ? all : none;
            return value_low == kWordMax ? none : WordRanges{{value_low + 1, kWordMax}};
        case SCMP_CMP_GE:
            if (high != value_high) return high > value_high ? all : none;
            return {{value_low, kWordMax}};
        case SCMP_CMP_MASKED_EQ: {
            const uint32_t mask_high = high_word(check.datum_a);
            const uint32_t mask_low = low_word(check.datum_a);
            const uint32_t want_high = high_word(check.datum_b);
            const uint32_t want_low = low_word(check.datum_b);
            if ((high & mask_high) != want_high || (want_low & ~mask_low) != 0) return none;
            return {{want_low, want_low | ~mask_low}};
        }
        default:
            return none;  // compared_high_words refused it first
    }
}

bool contains(const WordRanges& ranges, uint32_t word) {
    return std::any_of(ranges.begin(), ranges.end(), [word](const WordRange& range) {
        return range.first <= word && word <= range.last;
    });
}

// Which rule answers, for each low word when the high word is `high`: runs of equal answers.
std::vector<AnswerRun> answer_runs(const CheckedCall& call, uint32_t high, uint32_t no_match) {
    std::vector<WordRanges> holding;
    std::set<uint32_t> starts = {0};
    for (const ArgumentRule& rule : call.rules) {
        holding.push_back(holding_low_words(rule.check, high));
        for (const WordRange& range : holding.back()) {
            starts.insert(range.first);
            if (range.last < kWordMax) starts.insert(range.last + 1);
        }
    }
    std::vector<AnswerRun> runs;
    for (uint32_t start : starts) {
        uint32_t answer = no_match;
        for (size_t i = 0; i < call.rules.size(); ++i) {
            if (contains(holding[i], start)) {
                answer = call.rules[i].action;
                break;
            }
        }
        if (runs.empty() || runs.back().answer != answer) runs.push_back({start, answer});
    }
    return runs;
}

// High words from `first` to `last` whose low words are answered alike.
struct HighClass {
    uint32_t first = 0;
    uint32_t last = 0;
    std::vector<AnswerRun> runs;
};

bool same_runs(const std::vector<AnswerRun>& a, const std::vector<AnswerRun>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
        return x.start == y.start && x.answer == y.answer;
    });
}

// Each compared high word is a class of its own; the gaps between them are classes too.
std::vector<HighClass> high_classes(const CheckedCall& call, const std::set<uint32_t>& compared,
                                    uint32_t no_match) {
    std::vector<HighClass> classes;
    auto add = [&](uint32_t first, uint32_t last) {
        std::vector<AnswerRun> runs = answer_runs(call, first, no_match);
        if (!classes.empty() && same_runs(classes.back().runs, runs)) {
            classes.back().last = last;
        } else {
            classes.push_back({first, last, std::move(runs)});
        }
    };
    uint64_t next = 0;  // the first high word not yet in a class
    for (uint32_t word : compared) {
        if (word > next) add(static_cast<uint32_t>(next), word - 1);
        add(word, word);
        next = uint64_t{word} + 1;
    }
    if (next <= kWordMax) add(static_cast<uint32_t>(next), kWordMax);
    return classes;
}

// The search of one class's low words; a single answer needs no load.
std::optional<std::vector<sock_filter>> low_word_code(unsigned arg,
                                                      const std::vector<AnswerRun>& runs) {
    std::vector<sock_filter> code;
    if (runs.size() > 1) {
        code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, word_offset(arg, false)));
    }
    if (!append_run_search(code, runs)) return std::nullopt;
    return code;
}

// Appends `block` behind a jump over it: `test` with the accumulator unchanged falls into it when
// it holds (jeq) or does not (jgt), and skips it otherwise.
bool append_guarded(std::vector<sock_filter>& code, sock_filter test, bool enter_when_true,
                    const std::vector<sock_filter>& block) {
    if (block.size() > std::numeric_limits<uint8_t>::max()) return false;
    const auto skip = static_cast<uint8_t>(block.size());
    (enter_when_true ? test.jf : test.jt) = skip;
    code.push_back(test);
    code.insert(code.end(), block.begin(), block.end());
    return true;
}

}  // namespace

std::optional<std::vector<sock_filter>> argument_range_code(const CheckedCall& call,
                                                            uint32_t no_match) {
    if (call.rules.empty()) return std::nullopt;
    const unsigned arg = call.rules.front().check.arg;
    std::set<uint32_t> compared;
    for (const ArgumentRule& rule : call.rules) {
        if (rule.check.arg != arg || arg >= 6) return std::nullopt;
        const auto words = compared_high_words(rule.check);
        if (!words) return std::nullopt;
        compared.insert(words->begin(), words->end());
    }
    const std::vector<HighClass> classes = high_classes(call, compared, no_match);
    if (classes.size() == 1) return low_word_code(arg, classes.front().runs);

    // Blocks end in `ret`: a skipped one leaves the high word in the accumulator for the next test.
    std::vector<sock_filter> code = {BPF_STMT(BPF_LD | BPF_W | BPF_ABS, word_offset(arg, true))};
    for (size_t i = 0; i < classes.size(); ++i) {
        const auto block = low_word_code(arg, classes[i].runs);
        if (!block) return std::nullopt;
        if (i + 1 == classes.size()) {
            code.insert(code.end(), block->begin(), block->end());
        } else if (!append_guarded(code, BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, classes[i].last, 0, 0),
                                   false, *block)) {
            return std::nullopt;
        }
    }
    return code;
}

std::optional<std::vector<sock_filter>> argument_range_dispatch(
    const std::vector<CheckedCall>& calls, uint32_t no_match, uint32_t sentinel) {
    std::vector<sock_filter> code = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
    for (const CheckedCall& call : calls) {
        const auto block = argument_range_code(call, no_match);
        if (!block || !append_guarded(code, BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, call.number, 0, 0),
                                      true, *block)) {
            return std::nullopt;
        }
    }
    code.push_back(BPF_STMT(BPF_RET | BPF_K, sentinel));
    return code;
}

}  // namespace sqbox

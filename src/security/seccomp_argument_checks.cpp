#include "security/seccomp_argument_checks.h"

#include <linux/seccomp.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <set>
#include <utility>

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
            // libseccomp compares with the value's masked bits only.
            const uint32_t want_high = high_word(check.datum_b) & mask_high;
            const uint32_t want_low = low_word(check.datum_b) & mask_low;
            if ((high & mask_high) != want_high) return none;
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

// Each compared high word is a class of its own; the gaps between them are classes too.
std::vector<HighClass> high_classes(const CheckedCall& call, const std::set<uint32_t>& compared,
                                    uint32_t no_match) {
    std::vector<HighClass> classes;
    auto add = [&](uint32_t first, uint32_t last) {
        std::vector<AnswerRun> runs = answer_runs(call, first, no_match);
        if (!classes.empty() && classes.back().runs == runs) {
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

// One test of a word of the argument: `jeq k` or `jset k`, after `and mask` unless the mask is
// all ones. Each branch goes on to the group's next test, to the group's answer, or to the next
// group.
enum class Goal : uint8_t { kNext, kMatch, kFail };

struct WordTest {
    bool high = false;
    uint32_t mask = kWordMax;
    uint16_t jump = BPF_JEQ;
    uint32_t k = 0;
    Goal when_true = Goal::kNext;
    Goal when_false = Goal::kFail;
};

// Consecutive rules with one answer, tested together. `equal_high`: a group of EQ rules, which
// share the test of the high word; `bits`: a group of single-bit tests, which share one `jset`.
struct TestGroup {
    unsigned arg = 0;
    uint32_t action = 0;
    std::vector<WordTest> tests;
    bool always = false;  // holds whatever the argument
    std::optional<uint32_t> equal_high;
    bool bits = false;
};

bool single_bit(uint32_t word) {
    return word != 0 && (word & (word - 1)) == 0;
}

// The tests of one rule; nullopt for a comparison this shape does not do.
std::optional<TestGroup> rule_tests(const ArgumentRule& rule) {
    const scmp_arg_cmp& check = rule.check;
    TestGroup group{check.arg, rule.action, {}, false, std::nullopt, false};
    const uint32_t high_a = high_word(check.datum_a);
    const uint32_t low_a = low_word(check.datum_a);
    switch (check.op) {
        case SCMP_CMP_EQ:
            group.tests = {{true, kWordMax, BPF_JEQ, high_a, Goal::kNext, Goal::kFail},
                           {false, kWordMax, BPF_JEQ, low_a, Goal::kMatch, Goal::kFail}};
            group.equal_high = high_a;
            return group;
        case SCMP_CMP_NE:
            group.tests = {{true, kWordMax, BPF_JEQ, high_a, Goal::kNext, Goal::kMatch},
                           {false, kWordMax, BPF_JEQ, low_a, Goal::kFail, Goal::kMatch}};
            return group;
        case SCMP_CMP_MASKED_EQ:
            break;
        default:
            return std::nullopt;
    }
    // libseccomp compares with the value's masked bits only.
    const uint32_t want_high = high_word(check.datum_b) & high_a;
    const uint32_t want_low = low_word(check.datum_b) & low_a;
    if (high_a != 0) {
        group.tests.push_back({true, high_a, BPF_JEQ, want_high,
                               low_a == 0 ? Goal::kMatch : Goal::kNext, Goal::kFail});
    }
    if (low_a == 0) {
        // Nothing of the low word is compared.
    } else if (want_low == 0) {
        group.tests.push_back({false, kWordMax, BPF_JSET, low_a, Goal::kFail, Goal::kMatch});
    } else if (want_low == low_a && single_bit(low_a)) {
        group.tests.push_back({false, kWordMax, BPF_JSET, low_a, Goal::kMatch, Goal::kFail});
        group.bits = high_a == 0;
    } else {
        group.tests.push_back({false, low_a, BPF_JEQ, want_low, Goal::kMatch, Goal::kFail});
    }
    group.always = group.tests.empty();
    return group;
}

// Adds `rule` to the last group where it can share its tests, else as a group of its own.
void add_to_groups(std::vector<TestGroup>& groups, TestGroup rule) {
    if (!groups.empty()) {
        TestGroup& last = groups.back();
        const bool same = last.arg == rule.arg && last.action == rule.action && !last.always;
        if (same && last.equal_high && rule.equal_high == last.equal_high) {
            last.tests.back().when_false = Goal::kNext;
            last.tests.push_back(rule.tests.back());
            return;
        }
        if (same && last.bits && rule.bits) {
            last.tests.back().k |= rule.tests.back().k;
            return;
        }
    }
    groups.push_back(std::move(rule));
}

// The values of one argument `check` holds for lie within [first, last]: exactly for the
// comparisons of order and EQ, a bound for MASKED_EQ; nullopt for none at all.
std::optional<std::pair<uint64_t, uint64_t>> value_bounds(const scmp_arg_cmp& check) {
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    const uint64_t value = check.datum_a;
    switch (check.op) {
        case SCMP_CMP_EQ:
            return std::pair{value, value};
        case SCMP_CMP_LT:
            if (value == 0) return std::nullopt;
            return std::pair{uint64_t{0}, value - 1};
        case SCMP_CMP_LE:
            return std::pair{uint64_t{0}, value};
        case SCMP_CMP_GT:
            if (value == kMax) return std::nullopt;
            return std::pair{value + 1, kMax};
        case SCMP_CMP_GE:
            return std::pair{value, kMax};
        case SCMP_CMP_MASKED_EQ: {
            const uint64_t want = check.datum_b & check.datum_a;
            return std::pair{want, want | ~check.datum_a};
        }
        default:
            return std::pair{uint64_t{0}, kMax};  // NE and anything else: anywhere
    }
}

// Whether some value of the argument both test could satisfy both (true when unsure).
bool may_both_hold(const scmp_arg_cmp& a, const scmp_arg_cmp& b) {
    if (a.op == SCMP_CMP_MASKED_EQ && b.op == SCMP_CMP_MASKED_EQ) {
        return ((a.datum_b ^ b.datum_b) & a.datum_a & b.datum_a) == 0;
    }
    const auto bounds_a = value_bounds(a);
    const auto bounds_b = value_bounds(b);
    if (!bounds_a || !bounds_b) return false;
    return bounds_a->first <= bounds_b->second && bounds_b->first <= bounds_a->second;
}

// Both shapes answer with the first rule that holds, in the profile's order. libseccomp tries a
// call's rules in an order of its own (by argument, word, operator and value), so where rules
// with different answers both hold, the two may disagree. Unless one of them is EQ: then they
// overlap in one value at most, which the compiler's check against libseccomp's program probes
// (rules with different answers all test one argument, or this refuses them).
bool answer_depends_on_rule_order(const CheckedCall& call) {
    for (size_t i = 0; i < call.rules.size(); ++i) {
        for (size_t j = i + 1; j < call.rules.size(); ++j) {
            const scmp_arg_cmp& a = call.rules[i].check;
            const scmp_arg_cmp& b = call.rules[j].check;
            if (call.rules[i].action == call.rules[j].action) continue;
            if (a.arg != b.arg) return true;
            if (a.op == SCMP_CMP_EQ || b.op == SCMP_CMP_EQ) continue;
            if (may_both_hold(a, b)) return true;
        }
    }
    return false;
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

std::optional<std::vector<sock_filter>> argument_sequence_code(const CheckedCall& call,
                                                               uint32_t no_match) {
    std::vector<TestGroup> groups;
    for (const ArgumentRule& rule : call.rules) {
        if (rule.check.arg >= 6) return std::nullopt;
        std::optional<TestGroup> tests = rule_tests(rule);
        if (!tests) return std::nullopt;
        const bool always = tests->always;
        add_to_groups(groups, std::move(*tests));
        if (always) break;  // the rules after it are never reached
    }

    // Which word the accumulator holds, as loaded: arg * 2 + (high ? 1 : 0), or -1 (unknown, or
    // masked).
    constexpr int kUnknown = -1;
    struct Branch {
        size_t insn = 0;
        bool taken = false;
        Goal goal = Goal::kNext;
        size_t group = 0;
    };
    std::vector<sock_filter> code;
    std::vector<Branch> branches;
    std::vector<size_t> group_start;
    int held = kUnknown;
    for (size_t g = 0; g < groups.size(); ++g) {
        const TestGroup& group = groups[g];
        group_start.push_back(code.size());
        if (group.always) {
            code.push_back(BPF_STMT(BPF_RET | BPF_K, group.action));
            held = kUnknown;
            continue;
        }
        std::optional<int> held_on_failure;
        bool failures_agree = true;
        for (const WordTest& test : group.tests) {
            const int word = static_cast<int>(group.arg * 2 + (test.high ? 1 : 0));
            if (held != word) {
                code.push_back(
                    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, word_offset(group.arg, test.high)));
                held = word;
            }
            if (test.mask != kWordMax) {
                code.push_back(BPF_STMT(BPF_ALU | BPF_AND | BPF_K, test.mask));
                held = kUnknown;
            }
            branches.push_back({code.size(), true, test.when_true, g});
            branches.push_back({code.size(), false, test.when_false, g});
            code.push_back(BPF_JUMP(BPF_JMP | test.jump | BPF_K, test.k, 0, 0));
            if (test.when_true == Goal::kFail || test.when_false == Goal::kFail) {
                if (held_on_failure && *held_on_failure != held) failures_agree = false;
                held_on_failure = held;
            }
        }
        // The next group is reached only by this one's failures.
        held = failures_agree && held_on_failure ? *held_on_failure : kUnknown;
    }
    group_start.push_back(code.size());
    // Unreached after a rule that always holds.
    if (groups.empty() || !groups.back().always) {
        code.push_back(BPF_STMT(BPF_RET | BPF_K, no_match));
    }
    std::map<uint32_t, size_t> ret_at;
    for (const TestGroup& group : groups) {
        if (!group.always && ret_at.count(group.action) == 0) {
            ret_at[group.action] = code.size();
            code.push_back(BPF_STMT(BPF_RET | BPF_K, group.action));
        }
    }
    for (const Branch& branch : branches) {
        size_t target = branch.insn + 1;
        if (branch.goal == Goal::kMatch) target = ret_at.at(groups[branch.group].action);
        if (branch.goal == Goal::kFail) target = group_start[branch.group + 1];
        const size_t offset = target - (branch.insn + 1);
        if (offset > std::numeric_limits<uint8_t>::max()) return std::nullopt;
        sock_filter& insn = code[branch.insn];
        (branch.taken ? insn.jt : insn.jf) = static_cast<uint8_t>(offset);
    }
    return code;
}

std::optional<std::vector<sock_filter>> argument_check_code(const CheckedCall& call,
                                                            uint32_t no_match) {
    if (answer_depends_on_rule_order(call)) return std::nullopt;
    auto ranges = argument_range_code(call, no_match);
    auto sequence = argument_sequence_code(call, no_match);
    if (ranges && (!sequence || ranges->size() <= sequence->size())) return ranges;
    return sequence;
}

std::optional<std::vector<sock_filter>> argument_check_dispatch(
    const std::vector<CheckedCall>& calls, uint32_t no_match, uint32_t sentinel) {
    std::vector<sock_filter> code = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
    for (const CheckedCall& call : calls) {
        const auto block = argument_check_code(call, no_match);
        if (!block || !append_guarded(code, BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, call.number, 0, 0),
                                      true, *block)) {
            return std::nullopt;
        }
    }
    code.push_back(BPF_STMT(BPF_RET | BPF_K, sentinel));
    return code;
}

}  // namespace sqbox

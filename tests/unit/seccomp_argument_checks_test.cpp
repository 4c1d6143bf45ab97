// The range search for calls whose rules test one argument (security/seccomp_argument_checks.h),
// checked against the rules' meaning computed here on whole 64-bit values, not against the
// generator's own split into words.
#include <gtest/gtest.h>
#include <linux/seccomp.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "security/seccomp_argument_checks.h"
#include "security/seccomp_bpf_eval.h"

namespace sqbox {
namespace {

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | 1;
constexpr uint32_t kNoMatch = SECCOMP_RET_ERRNO | 38;
constexpr uint32_t kSentinel = SECCOMP_RET_TRACE | 7;
constexpr uint32_t kCall = 16;

bool holds(const scmp_arg_cmp& check, uint64_t value) {
    switch (check.op) {
        case SCMP_CMP_EQ:
            return value == check.datum_a;
        case SCMP_CMP_NE:
            return value != check.datum_a;
        case SCMP_CMP_LT:
            return value < check.datum_a;
        case SCMP_CMP_LE:
            return value <= check.datum_a;
        case SCMP_CMP_GT:
            return value > check.datum_a;
        case SCMP_CMP_GE:
            return value >= check.datum_a;
        case SCMP_CMP_MASKED_EQ:
            return (value & check.datum_a) == (check.datum_b & check.datum_a);
        default:
            ADD_FAILURE() << "operator " << check.op;
            return false;
    }
}

uint32_t expected_answer(const CheckedCall& call, uint64_t value) {
    for (const ArgumentRule& rule : call.rules) {
        if (holds(rule.check, value)) return rule.action;
    }
    return kNoMatch;
}

uint32_t answer(const std::vector<sock_filter>& program, uint32_t nr, unsigned arg,
                uint64_t value) {
    SyscallCall call{static_cast<int>(nr), AUDIT_ARCH_X86_64, {}};
    call.args[arg] = value;
    return evaluate_seccomp(program, call);
}

// Every rule's values, the values next to them and where its masks' ranges end, plus noise.
std::vector<uint64_t> probe_values(const CheckedCall& call, std::mt19937_64& random) {
    std::vector<uint64_t> values = {0, 1, ~uint64_t{0}, 0xffffffff, uint64_t{1} << 32};
    for (const ArgumentRule& rule : call.rules) {
        const uint64_t last = rule.check.datum_b | ~rule.check.datum_a;
        for (uint64_t v : {rule.check.datum_a, rule.check.datum_b, last, last & 0xffffffff}) {
            for (uint64_t near : {v - 1, v, v + 1}) values.push_back(near);
        }
    }
    for (int i = 0; i < 200; ++i) values.push_back(random());
    return values;
}

TEST(SeccompArgumentChecks, AnswersAsTheFirstRuleThatHoldsOnRandomRuleSets) {
    std::mt19937_64 random(20261122);
    const uint64_t high_words[] = {0, 1, 0xffffffff};
    const scmp_compare ops[] = {SCMP_CMP_EQ, SCMP_CMP_NE, SCMP_CMP_LT,       SCMP_CMP_LE,
                                SCMP_CMP_GT, SCMP_CMP_GE, SCMP_CMP_MASKED_EQ};
    size_t probes = 0;
    for (int round = 0; round < 300; ++round) {
        CheckedCall call{kCall, {}};
        const unsigned arg = round % 6;
        const int rule_count = 1 + static_cast<int>(random() % 6);
        for (int i = 0; i < rule_count; ++i) {
            scmp_arg_cmp check{arg, ops[random() % 7], 0, 0};
            const uint64_t high = high_words[random() % 3] << 32;
            if (check.op == SCMP_CMP_MASKED_EQ) {
                const auto free_bits =
                    static_cast<unsigned>(random() % 33);  // the low bits the mask ignores
                const uint64_t low_mask = free_bits == 32 ? 0 : (0xffffffffULL << free_bits);
                const uint64_t mask =
                    (random() % 2 == 0 ? 0 : 0xffffffff00000000ULL) | (low_mask & 0xffffffffULL);
                check.datum_a = mask;
                check.datum_b = (high | (random() & 0xffffffff)) & mask;
            } else {
                check.datum_a = high | (random() % 4 == 0 ? 0xffffffff : random() & 0xffff);
            }
            call.rules.push_back({random() % 2 == 0 ? kAllow : kRefuse, check});
        }
        const auto program = argument_range_code(call, kNoMatch);
        ASSERT_TRUE(program.has_value()) << "round " << round;
        for (uint64_t value : probe_values(call, random)) {
            ASSERT_EQ(answer(*program, kCall, arg, value), expected_answer(call, value))
                << "round " << round << " value 0x" << std::hex << value;
            ++probes;
        }
    }
    EXPECT_GT(probes, 60000u);
}

// Rules of scattered bits and equalities, in any argument, as clone's and personality's are.
TEST(SeccompArgumentChecks, SequenceAnswersAsTheFirstRuleThatHoldsOnRandomRuleSets) {
    std::mt19937_64 random(112026);
    size_t probes = 0;
    for (int round = 0; round < 400; ++round) {
        CheckedCall call{kCall, {}};
        const int rule_count = 1 + static_cast<int>(random() % 8);
        for (int i = 0; i < rule_count; ++i) {
            const auto arg = static_cast<unsigned>(random() % 2 == 0 ? 0 : random() % 6);
            scmp_arg_cmp check{arg, SCMP_CMP_MASKED_EQ, 0, 0};
            const uint64_t high = (random() % 3 == 0 ? 1ULL : 0ULL) << 32;
            switch (random() % 5) {
                case 0:
                    check.op = random() % 2 == 0 ? SCMP_CMP_EQ : SCMP_CMP_NE;
                    check.datum_a = high | (random() & 0x3f);
                    break;
                case 1:  // one bit set
                    check.datum_a = check.datum_b = 1ULL << (random() % 32);
                    break;
                case 2:  // none of some bits
                    check.datum_a = random() & 0x7e020000ULL;
                    break;
                case 3:  // any mask, any value within it, the high word too
                    check.datum_a = random() & (random() | 0xffffffff00000000ULL);
                    check.datum_b = random() & check.datum_a;
                    break;
                default:  // a value with bits outside its mask, which count for nothing
                    check.datum_a = random() & 0xffff;
                    check.datum_b = random();
                    break;
            }
            call.rules.push_back({random() % 2 == 0 ? kAllow : kRefuse, check});
        }
        const auto program = argument_sequence_code(call, kNoMatch);
        ASSERT_TRUE(program.has_value()) << "round " << round;
        for (uint64_t value : probe_values(call, random)) {
            for (unsigned arg : {0U, 1U, 5U}) {
                SyscallCall probe{static_cast<int>(kCall), AUDIT_ARCH_X86_64, {}};
                for (auto& a : probe.args) a = random() % 4 == 0 ? random() : value;
                probe.args[arg] = value;
                uint32_t expected = kNoMatch;
                for (const ArgumentRule& rule : call.rules) {
                    if (holds(rule.check, probe.args[rule.check.arg])) {
                        expected = rule.action;
                        break;
                    }
                }
                ASSERT_EQ(evaluate_seccomp(*program, probe), expected)
                    << "round " << round << " value 0x" << std::hex << value;
                ++probes;
            }
        }
    }
    EXPECT_GT(probes, 100000u);
}

// A mask of 0 compares nothing: the rule holds for every value, and the rules after it are never
// reached.
TEST(SeccompArgumentChecks, SequenceAnswersAtOnceForARuleThatAlwaysHolds) {
    const CheckedCall call{
        kCall, {{kRefuse, {0, SCMP_CMP_MASKED_EQ, 0, 0x1234}}, {kAllow, {0, SCMP_CMP_EQ, 5, 0}}}};
    const auto program = argument_sequence_code(call, kNoMatch);
    ASSERT_TRUE(program.has_value());
    EXPECT_EQ(program->size(), 1u);
    EXPECT_EQ(answer(*program, kCall, 0, 5), kRefuse);
}

// clone's rules in sqbox's default profile: no namespace flag, else refused flag by flag.
TEST(SeccompArgumentChecks, SequenceSharesLoadsAndBitTests) {
    CheckedCall clone{kCall, {{kAllow, {0, SCMP_CMP_MASKED_EQ, 0x7e020000, 0}}}};
    for (uint64_t flag : {0x20000ULL, 0x2000000ULL, 0x4000000ULL, 0x8000000ULL, 0x10000000ULL,
                          0x20000000ULL, 0x40000000ULL}) {
        clone.rules.push_back({kRefuse, {0, SCMP_CMP_MASKED_EQ, flag, flag}});
    }
    const auto program = argument_check_code(clone, kNoMatch);
    ASSERT_TRUE(program.has_value());
    EXPECT_LE(program->size(), 6u);  // load, two tests, three answers
    EXPECT_EQ(answer(*program, kCall, 0, 0x11), kAllow);
    EXPECT_EQ(answer(*program, kCall, 0, 0x10000000), kRefuse);
    EXPECT_EQ(answer(*program, kCall, 0, 0x10000011ULL | (1ULL << 40)), kRefuse);
    EXPECT_EQ(answer(*program, kCall, 0, 0x100000000ULL), kAllow);  // the high word is not tested
}

// Masked rules that allow the low words from `first` to `last`: the largest aligned blocks.
void allow_low_words(CheckedCall& call, unsigned arg, uint64_t first, uint64_t last) {
    while (first <= last) {
        unsigned bits = 0;
        while (bits < 32 && (first & ((uint64_t{2} << bits) - 1)) == 0 &&
               first + (uint64_t{2} << bits) - 1 <= last) {
            ++bits;
        }
        const uint64_t mask = (0xffffffffULL << bits) & 0xffffffffULL;
        call.rules.push_back({kAllow, {arg, SCMP_CMP_MASKED_EQ, mask, first}});
        first += uint64_t{1} << bits;
    }
}

// Rules like sqbox's own for ioctl: every request but TIOCSTI and TIOCLINUX, in the low 32 bits
// only, as a cover of masks, then the two refusals.
TEST(SeccompArgumentChecks, TurnsMaskCoversIntoAFewComparisons) {
    CheckedCall call{kCall, {}};
    allow_low_words(call, 1, 0, 0x5411);
    allow_low_words(call, 1, 0x5413, 0x541b);
    allow_low_words(call, 1, 0x541d, 0xffffffff);
    EXPECT_GT(call.rules.size(), 30u);
    call.rules.push_back({kRefuse, {1, SCMP_CMP_MASKED_EQ, 0xffffffff, 0x5412}});
    call.rules.push_back({kRefuse, {1, SCMP_CMP_MASKED_EQ, 0xffffffff, 0x541c}});
    const auto program = argument_range_code(call, kNoMatch);
    ASSERT_TRUE(program.has_value());
    EXPECT_LE(program->size(), 8u);
    std::mt19937_64 random(7);
    for (uint64_t value : probe_values(call, random)) {
        EXPECT_EQ(answer(*program, kCall, 1, value), expected_answer(call, value))
            << "value 0x" << std::hex << value;
    }
    EXPECT_EQ(answer(*program, kCall, 1, 0x5412), kRefuse);
    EXPECT_EQ(answer(*program, kCall, 1, 0xabcd00005412ULL), kRefuse);
    EXPECT_EQ(answer(*program, kCall, 1, 0x5413), kAllow);
}

TEST(SeccompArgumentChecks, RefusesShapesItCannotBuild) {
    // A mask of scattered bits (clone's namespace flags), a mask of part of the high word, two
    // arguments.
    const CheckedCall scattered{kCall, {{kAllow, {0, SCMP_CMP_MASKED_EQ, 0x7e020000, 0}}}};
    EXPECT_FALSE(argument_range_code(scattered, kNoMatch).has_value());
    const CheckedCall partial_high{kCall,
                                   {{kAllow, {0, SCMP_CMP_MASKED_EQ, 0x0000ffff00000000ULL, 0}}}};
    EXPECT_FALSE(argument_range_code(partial_high, kNoMatch).has_value());
    const CheckedCall two_args{
        kCall, {{kAllow, {0, SCMP_CMP_EQ, 1, 0}}, {kRefuse, {1, SCMP_CMP_EQ, 1, 0}}}};
    EXPECT_FALSE(argument_range_code(two_args, kNoMatch).has_value());
    EXPECT_FALSE(argument_range_code(CheckedCall{kCall, {}}, kNoMatch).has_value());
    // The sequence does those, but no ordering comparison; then neither shape applies.
    EXPECT_TRUE(argument_check_code(scattered, kNoMatch).has_value());
    EXPECT_TRUE(argument_sequence_code(two_args, kNoMatch).has_value());
    const CheckedCall ordering_and_two_args{
        kCall, {{kAllow, {0, SCMP_CMP_GT, 1, 0}}, {kRefuse, {1, SCMP_CMP_EQ, 1, 0}}}};
    EXPECT_FALSE(argument_sequence_code(ordering_and_two_args, kNoMatch).has_value());
    EXPECT_FALSE(argument_check_code(ordering_and_two_args, kNoMatch).has_value());
    EXPECT_FALSE(argument_check_dispatch({scattered, ordering_and_two_args}, kNoMatch, kSentinel)
                     .has_value());
}

// libseccomp does not try rules in the profile's order; where the order could decide, neither
// shape is built (the call keeps libseccomp's code).
TEST(SeccompArgumentChecks, RefusesRuleSetsWhoseAnswerDependsOnTheOrder) {
    // Two masks with different answers that both hold for 0x56781234.
    const CheckedCall masks{kCall,
                            {{kAllow, {0, SCMP_CMP_MASKED_EQ, 0xffff, 0x1234}},
                             {kRefuse, {0, SCMP_CMP_MASKED_EQ, 0xffff0000, 0x56780000}}}};
    EXPECT_TRUE(argument_sequence_code(masks, kNoMatch).has_value());
    EXPECT_FALSE(argument_check_code(masks, kNoMatch).has_value());
    // A value's bits outside its mask count for nothing: these overlap too.
    const CheckedCall masked_values{kCall,
                                    {{kRefuse, {0, SCMP_CMP_MASKED_EQ, 0xffff0000, 0x156780000}},
                                     {kAllow, {0, SCMP_CMP_MASKED_EQ, 0xffff, 0x1234}}}};
    EXPECT_FALSE(argument_check_code(masked_values, kNoMatch).has_value());
    // Different arguments, different answers; an order comparison and a mask.
    const CheckedCall two_args{
        kCall, {{kAllow, {0, SCMP_CMP_EQ, 1, 0}}, {kRefuse, {1, SCMP_CMP_EQ, 1, 0}}}};
    EXPECT_FALSE(argument_check_code(two_args, kNoMatch).has_value());
    const CheckedCall range_and_mask{
        kCall, {{kRefuse, {0, SCMP_CMP_LE, 10, 0}}, {kAllow, {0, SCMP_CMP_MASKED_EQ, 0xf0, 0}}}};
    EXPECT_FALSE(argument_check_code(range_and_mask, kNoMatch).has_value());

    // Disjoint masks (clone's), overlaps in one EQ value (personality's 0xffffffff), different
    // arguments with one answer: built.
    const CheckedCall disjoint{kCall,
                               {{kAllow, {0, SCMP_CMP_MASKED_EQ, 0x7e020000, 0}},
                                {kRefuse, {0, SCMP_CMP_MASKED_EQ, 0x20000, 0x20000}}}};
    EXPECT_TRUE(argument_check_code(disjoint, kNoMatch).has_value());
    const CheckedCall one_value{kCall,
                                {{kAllow, {0, SCMP_CMP_EQ, 0xffffffff, 0}},
                                 {kRefuse, {0, SCMP_CMP_MASKED_EQ, 0x40000, 0x40000}}}};
    EXPECT_TRUE(argument_check_code(one_value, kNoMatch).has_value());
    const CheckedCall one_answer{
        kCall, {{kAllow, {0, SCMP_CMP_EQ, 1, 0}}, {kAllow, {1, SCMP_CMP_MASKED_EQ, 7, 7}}}};
    EXPECT_TRUE(argument_check_code(one_answer, kNoMatch).has_value());
}

TEST(SeccompArgumentChecks, DispatchAnswersOtherCallsWithTheSentinel) {
    const CheckedCall socket{
        41, {{kAllow, {0, SCMP_CMP_EQ, 1, 0}}, {kRefuse, {0, SCMP_CMP_LE, 45, 0}}}};
    const CheckedCall prlimit{302, {{kRefuse, {0, SCMP_CMP_NE, 0, 0}}}};
    const auto program = argument_check_dispatch({socket, prlimit}, kNoMatch, kSentinel);
    ASSERT_TRUE(program.has_value());
    EXPECT_EQ(answer(*program, 41, 0, 1), kAllow);
    EXPECT_EQ(answer(*program, 41, 0, 17), kRefuse);
    EXPECT_EQ(answer(*program, 41, 0, 46), kNoMatch);
    EXPECT_EQ(answer(*program, 41, 0, (uint64_t{1} << 32) | 1), kNoMatch);
    EXPECT_EQ(answer(*program, 302, 0, 0), kNoMatch);
    EXPECT_EQ(answer(*program, 302, 0, uint64_t{1} << 32), kRefuse);
    for (uint32_t nr : {0U, 40U, 42U, 301U, 303U, 0xffffffffU}) {
        EXPECT_EQ(answer(*program, nr, 0, 1), kSentinel) << "call " << nr;
    }
}

}  // namespace
}  // namespace sqbox

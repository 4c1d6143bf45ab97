// The search over runs of call numbers that replaces libseccomp's per-call comparisons
// (security/seccomp_range_dispatch.h), on hand-made inputs, evaluated in user space.
#include <gtest/gtest.h>
#include <linux/seccomp.h>

#include <cstdint>
#include <iterator>
#include <limits>
#include <set>

#include "security/seccomp_bpf_eval.h"
#include "security/seccomp_range_dispatch.h"
#include "util/errors.h"

namespace sqbox {
namespace {

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | 1;
constexpr uint32_t kUnknown = SECCOMP_RET_ERRNO | 38;
constexpr uint32_t kSentinel = SECCOMP_RET_TRACE | 7;
constexpr uint32_t kConditional = SECCOMP_RET_ERRNO | 13;
constexpr uint32_t kConditionalCall = 99;

// What libseccomp's part would be: call 99 with argument 0 equal to 1 gets its own answer, the
// rest of call 99 and every other call the sentinel (from two places, as libseccomp does).
std::vector<sock_filter> conditional_part() {
    return {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kConditionalCall, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, kSentinel),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, kConditional),
        BPF_STMT(BPF_RET | BPF_K, kSentinel),
    };
}

uint32_t answer(const std::vector<sock_filter>& program, uint32_t nr, uint64_t arg0 = 0) {
    return evaluate_seccomp(
        program, SyscallCall{static_cast<int>(nr), AUDIT_ARCH_X86_64, {arg0, 0, 0, 0, 0, 0}});
}

TEST(SeccompRangeDispatch, AnswersEachRunAndTheGapsBetweenThem) {
    RangeDispatchParts parts;
    parts.conditional = conditional_part();
    parts.sentinel = kSentinel;
    parts.default_answer = kUnknown;
    parts.plain_answers = {{0, kAllow}, {1, kAllow},  {2, kRefuse}, {5, kAllow},   {6, kAllow},
                           {7, kAllow}, {8, kRefuse}, {9, kAllow},  {400, kAllow}, {401, kRefuse}};
    const auto program = build_range_dispatch(parts);
    ASSERT_TRUE(program.has_value());
    for (uint32_t nr = 0; nr < 1000; ++nr) {
        const auto listed = parts.plain_answers.find(nr);
        const uint32_t expected = listed != parts.plain_answers.end() ? listed->second : kUnknown;
        EXPECT_EQ(answer(*program, nr), expected) << "call " << nr;
    }
    for (uint32_t nr : {0x40000000U, 0x7fffffffU, 0xffffffffU}) {
        EXPECT_EQ(answer(*program, nr), kUnknown) << "call " << nr;
    }
    // The conditional call keeps its own code; where that code has no answer, the default.
    EXPECT_EQ(answer(*program, kConditionalCall, 1), kConditional);
    EXPECT_EQ(answer(*program, kConditionalCall, 2), kUnknown);
    // Every plain call is answered from the call number alone: the kernel can cache it.
    EXPECT_EQ(constant_seccomp_answer(*program, 5, AUDIT_ARCH_X86_64), kAllow);
    EXPECT_EQ(constant_seccomp_answer(*program, kConditionalCall, AUDIT_ARCH_X86_64), std::nullopt);
}

TEST(SeccompRangeDispatch, HandlesNoPlainCallsAndTheLargestNumber) {
    RangeDispatchParts parts;
    parts.conditional = conditional_part();
    parts.sentinel = kSentinel;
    parts.default_answer = kUnknown;
    auto program = build_range_dispatch(parts);
    ASSERT_TRUE(program.has_value());
    EXPECT_EQ(answer(*program, 0), kUnknown);
    EXPECT_EQ(answer(*program, kConditionalCall, 1), kConditional);

    const uint32_t largest = std::numeric_limits<uint32_t>::max();
    parts.plain_answers = {{largest, kAllow}};
    program = build_range_dispatch(parts);
    ASSERT_TRUE(program.has_value());
    EXPECT_EQ(answer(*program, largest), kAllow);
    EXPECT_EQ(answer(*program, largest - 1), kUnknown);
}

TEST(SeccompRangeDispatch, RefusesWhatItCannotBuildRatherThanBuildingItWrong) {
    RangeDispatchParts parts;
    parts.conditional = conditional_part();
    parts.sentinel = SECCOMP_RET_TRACE | 8;  // never answered: nowhere to attach the search
    EXPECT_FALSE(build_range_dispatch(parts).has_value());

    // Alternating answers make a run per number: the answers end up further from the first
    // comparisons than an 8-bit jump reaches.
    parts.sentinel = kSentinel;
    for (uint32_t nr = 0; nr < 2000; ++nr) parts.plain_answers[nr] = nr % 2 == 0 ? kAllow : kRefuse;
    EXPECT_FALSE(build_range_dispatch(parts).has_value());
}

// The evaluator refuses what the kernel's verifier would: a load past seccomp_data (k + 4 must not
// wrap around to pass the check), a jump past the end, a program without an answer.
TEST(SeccompBpfEval, RefusesProgramsTheKernelWouldNotRun) {
    for (uint32_t offset : {64U, 0xfffffffcU, 2U}) {
        const std::vector<sock_filter> program = {BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset),
                                                  BPF_STMT(BPF_RET | BPF_K, kAllow)};
        EXPECT_THROW((void)answer(program, 0), Error) << "offset " << offset;
    }
    EXPECT_THROW(
        (void)answer({BPF_JUMP(BPF_JMP | BPF_JA, 5, 0, 0), BPF_STMT(BPF_RET | BPF_K, 0)}, 0),
        Error);
    EXPECT_THROW((void)answer({BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0)}, 0), Error);
    // The last word of seccomp_data is still readable.
    EXPECT_EQ(answer({BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 60), BPF_STMT(BPF_RET | BPF_A, 0)}, 0),
              0U);
}

// Between two consecutive boundaries the answer cannot change: the answer at the boundary at or
// below a number is the number's answer, for every number tried (the range search over runs, in
// front of it libseccomp-like code that tests an argument of one call).
TEST(SeccompBpfEval, WordBoundariesSplitTheNumbersWhereTheAnswerCannotChange) {
    RangeDispatchParts parts;
    parts.conditional = conditional_part();
    parts.sentinel = kSentinel;
    parts.default_answer = kUnknown;
    parts.plain_answers = {{0, kAllow}, {1, kAllow}, {2, kRefuse}, {7, kAllow}, {400, kAllow}};
    const auto program = build_range_dispatch(parts);
    ASSERT_TRUE(program.has_value());
    for (uint64_t arg0 : {uint64_t{0}, uint64_t{1}}) {
        const auto boundaries = word_boundaries(*program, offsetof(seccomp_data, nr));
        ASSERT_TRUE(boundaries.has_value());
        EXPECT_EQ(boundaries->count(0), 1u);
        EXPECT_EQ(boundaries->count(kConditionalCall + 1), 1u);
        for (uint32_t nr : {0U, 1U, 2U, 3U, 6U, 7U, 8U, 98U, 99U, 100U, 399U, 400U, 401U, 5000U,
                            0x40000000U, 0xffffffffU}) {
            const uint32_t start = *std::prev(boundaries->upper_bound(nr));
            EXPECT_EQ(answer(*program, nr, arg0), answer(*program, start, arg0))
                << "call " << nr << " boundary " << start;
        }
    }
    // The architecture is never compared: one stretch.
    EXPECT_EQ(word_boundaries(*program, offsetof(seccomp_data, arch)), std::set<uint32_t>{0});
}

// Anything done with the word but comparing it with a constant makes the answer change elsewhere
// than at the compared values: refused. The same done with another word is not the word's business.
TEST(SeccompBpfEval, WordBoundariesRefuseWhatIsNotAComparisonWithAConstant) {
    const sock_filter load_nr = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr));
    const sock_filter load_arg =
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0]));
    const sock_filter ret = BPF_STMT(BPF_RET | BPF_K, kAllow);
    const std::vector<std::vector<sock_filter>> refused = {
        {load_nr, BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xff), BPF_JUMP(BPF_JMP | BPF_JEQ, 1, 0, 0),
         ret},
        {load_nr, BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 1, 0, 0), ret},
        {load_nr, BPF_STMT(BPF_RET | BPF_A, 0)},
        {load_nr, BPF_STMT(BPF_ST, 0), ret},
        {load_nr, BPF_STMT(BPF_MISC | BPF_TAX, 0), BPF_STMT(BPF_LD | BPF_IMM, 5),
         BPF_JUMP(BPF_JMP | BPF_JGT | BPF_X, 0, 0, 0), ret},
        {BPF_STMT(BPF_LD | BPF_H | BPF_ABS, offsetof(seccomp_data, nr)), ret},
        // Holding the number on one path is enough.
        {load_arg, BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 1), load_nr,
         BPF_STMT(BPF_ALU | BPF_ADD | BPF_K, 1), ret},
    };
    for (size_t i = 0; i < refused.size(); ++i) {
        EXPECT_EQ(word_boundaries(refused[i], offsetof(seccomp_data, nr)), std::nullopt)
            << "program " << i;
    }
    const std::vector<sock_filter> with_argument = {load_arg,
                                                    BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xff),
                                                    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 1, 0, 1),
                                                    load_nr,
                                                    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 10, 0, 0),
                                                    ret};
    EXPECT_EQ(word_boundaries(with_argument, offsetof(seccomp_data, nr)),
              (std::set<uint32_t>{0, 10, 11}));
}

}  // namespace
}  // namespace sqbox

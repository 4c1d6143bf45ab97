// The search over runs of call numbers that replaces libseccomp's per-call comparisons
// (security/seccomp_range_dispatch.h), on hand-made inputs, evaluated in user space.
#include <gtest/gtest.h>
#include <linux/seccomp.h>

#include <cstdint>
#include <limits>

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

}  // namespace
}  // namespace sqbox

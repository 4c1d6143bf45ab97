// Smaller code for the system calls whose arguments a seccomp profile checks.
//
// libseccomp tests each condition of each rule in turn, reloading the argument for each: 100
// instructions for sqbox's ioctl rules alone (34 masks that together allow every request but
// two), 42 for personality's. Two shorter shapes, for calls whose rules test one condition each:
//
// - Ranges. Most such rules test one argument against a range of values: EQ is a range of one,
//   GE/GT/LE/LT a range up to an end, MASKED_EQ with a mask of leading ones (0xffffff00) a range
//   of 256 values. Then which rule answers first depends only on the range the argument falls
//   in, and a binary search over the ranges' bounds answers it: ioctl's rules become 5 ranges, 4
//   comparisons. The 64-bit argument is split as the kernel hands it over, two 32-bit words: the
//   high word picks a class (each value a rule tests it against, and the gaps between them), the
//   low word is searched within the class.
// - A sequence. Rules that test bits (clone's namespace flags, personality's) are tested in
//   order, as libseccomp does, but a word is loaded only when the accumulator does not already
//   hold it, consecutive equality tests with one answer share the high word's test, and
//   consecutive tests of single bits with one answer become one test of all of them.
//
// MASKED_EQ compares with the value's masked bits only, as libseccomp does.
#pragma once

#include <linux/filter.h>
#include <seccomp.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace sqbox {

// A rule with one condition. A call's rules are tried in order; the first that holds answers.
struct ArgumentRule {
    uint32_t action = 0;
    scmp_arg_cmp check{};
};

struct CheckedCall {
    uint32_t number = 0;
    std::vector<ArgumentRule> rules;
};

// Code that answers call `call.number` (the accumulator need not hold anything): the first rule
// that holds, or `no_match`, by a search over ranges. nullopt unless every rule tests the same
// argument with a comparison that is a range of values.
std::optional<std::vector<sock_filter>> argument_range_code(const CheckedCall& call,
                                                            uint32_t no_match);

// The same answers by testing the rules in order. nullopt for comparisons other than EQ, NE and
// MASKED_EQ, or a jump that does not fit.
std::optional<std::vector<sock_filter>> argument_sequence_code(const CheckedCall& call,
                                                               uint32_t no_match);

// The shorter of the two; nullopt if neither can be built, or if rules with different answers
// could both hold (other than at the one value of an EQ): both shapes answer with the first rule
// that holds, and libseccomp, whose program is the reference, tries rules in an order of its own.
std::optional<std::vector<sock_filter>> argument_check_code(const CheckedCall& call,
                                                            uint32_t no_match);

// Code that loads the call number and answers each of `calls` as argument_check_code does, and
// every other call `sentinel`. nullopt if a call has no such code or a jump does not fit.
std::optional<std::vector<sock_filter>> argument_check_dispatch(
    const std::vector<CheckedCall>& calls, uint32_t no_match, uint32_t sentinel);

}  // namespace sqbox

// Runs a classic-BPF seccomp program on a made-up system call, in user space: how sqbox checks
// that a filter it rewrote answers every call as the original does, and how tests ask "what
// would the kernel answer?" without installing a filter.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <span>

namespace sqbox {

struct SyscallCall {
    int nr = 0;
    uint32_t arch = AUDIT_ARCH_X86_64;
    std::array<uint64_t, 6> args{};
};

// The filter's return value (SECCOMP_RET_ACTION_FULL | data). Throws Error on a program the
// kernel would refuse to run: a load past seccomp_data, a jump past the end, an unknown opcode.
uint32_t evaluate_seccomp(std::span<const sock_filter> program, const SyscallCall& call);

// What the kernel's action cache makes of system call `nr` of `arch` when the filter is
// installed: it emulates the program with only the number and architecture known, and whatever
// ends in SECCOMP_RET_ALLOW that way is then allowed without running the filter at all. Returns
// that constant answer, or nullopt where the kernel gives up (the program reads an argument or
// uses an instruction its emulator does not know).
std::optional<uint32_t> constant_seccomp_answer(std::span<const sock_filter> program, int nr,
                                                uint32_t arch);

// The values of the 32-bit word at `offset` in seccomp_data (the call number, the architecture)
// at which `program`'s answer can change while the rest of seccomp_data stays as it is: 0, and
// each value the program compares the word with and the one after it. Between two consecutive
// ones every comparison of the word comes out alike, so the program takes the same path: running
// it at each of them covers all 2^32 values. nullopt where that does not hold: the program does
// anything with the word but compare it with a constant (arithmetic, a bit test, a comparison with
// X, storing it, returning it).
std::optional<std::set<uint32_t>> word_boundaries(std::span<const sock_filter> program,
                                                  uint32_t offset);

}  // namespace sqbox

#include "security/seccomp_bpf_eval.h"

#include <linux/seccomp.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "util/errors.h"

namespace sqbox {
namespace {

// Where the next instruction is after `pc` moved by `offset`, checked against the program's end.
size_t jump_target(size_t pc, uint32_t offset, size_t size) {
    const size_t next = pc + 1 + offset;
    if (next >= size) throw Error("seccomp program jumps past its end");
    return next;
}

bool jump_taken(uint16_t code, uint32_t a, uint32_t operand) {
    switch (BPF_OP(code)) {
        case BPF_JEQ:
            return a == operand;
        case BPF_JGT:
            return a > operand;
        case BPF_JGE:
            return a >= operand;
        case BPF_JSET:
            return (a & operand) != 0;
        default:
            throw Error("seccomp program has an unknown jump");
    }
}

uint32_t alu(uint16_t code, uint32_t a, uint32_t operand) {
    switch (BPF_OP(code)) {
        case BPF_ADD:
            return a + operand;
        case BPF_SUB:
            return a - operand;
        case BPF_MUL:
            return a * operand;
        case BPF_DIV:
            if (operand == 0) throw Error("seccomp program divides by zero");
            return a / operand;
        case BPF_MOD:
            if (operand == 0) throw Error("seccomp program divides by zero");
            return a % operand;
        case BPF_AND:
            return a & operand;
        case BPF_OR:
            return a | operand;
        case BPF_XOR:
            return a ^ operand;
        case BPF_LSH:
            return operand < 32 ? a << operand : 0;
        case BPF_RSH:
            return operand < 32 ? a >> operand : 0;
        case BPF_NEG:
            return 0U - a;
        default:
            throw Error("seccomp program has an unknown arithmetic instruction");
    }
}

}  // namespace

uint32_t evaluate_seccomp(std::span<const sock_filter> program, const SyscallCall& call) {
    seccomp_data data{};
    data.nr = call.nr;
    data.arch = call.arch;
    for (size_t i = 0; i < 6; ++i) data.args[i] = call.args[i];
    unsigned char bytes[sizeof data];
    std::memcpy(bytes, &data, sizeof data);

    uint32_t a = 0;
    uint32_t x = 0;
    uint32_t memory[BPF_MEMWORDS] = {};
    auto slot = [&memory](uint32_t k) -> uint32_t& {
        if (k >= BPF_MEMWORDS) throw Error("seccomp program uses scratch memory out of range");
        return memory[k];
    };
    size_t pc = 0;
    while (pc < program.size()) {
        const sock_filter& insn = program[pc];
        const uint32_t operand = BPF_SRC(insn.code) == BPF_X ? x : insn.k;
        switch (BPF_CLASS(insn.code)) {
            case BPF_LD:
                if (BPF_MODE(insn.code) == BPF_ABS && BPF_SIZE(insn.code) == BPF_W) {
                    // (k + 4 could wrap around.)
                    if (insn.k % 4 != 0 || insn.k > sizeof data - 4) {
                        throw Error("seccomp program loads outside seccomp_data");
                    }
                    std::memcpy(&a, bytes + insn.k, 4);
                } else if (BPF_MODE(insn.code) == BPF_IMM) {
                    a = insn.k;
                } else if (BPF_MODE(insn.code) == BPF_MEM) {
                    a = slot(insn.k);
                } else if (BPF_MODE(insn.code) == BPF_LEN) {
                    a = sizeof data;
                } else {
                    throw Error("seccomp program has an unknown load");
                }
                break;
            case BPF_LDX:
                if (BPF_MODE(insn.code) == BPF_MEM) {
                    x = slot(insn.k);
                } else if (BPF_MODE(insn.code) == BPF_LEN) {
                    x = sizeof data;
                } else {
                    x = insn.k;
                }
                break;
            case BPF_ST:
                slot(insn.k) = a;
                break;
            case BPF_STX:
                slot(insn.k) = x;
                break;
            case BPF_ALU:
                a = alu(insn.code, a, operand);
                break;
            case BPF_JMP:
                if (BPF_OP(insn.code) == BPF_JA) {
                    pc = jump_target(pc, insn.k, program.size());
                } else {
                    const bool taken = jump_taken(insn.code, a, operand);
                    pc = jump_target(pc, taken ? insn.jt : insn.jf, program.size());
                }
                continue;
            case BPF_RET:
                return BPF_RVAL(insn.code) == BPF_A ? a : insn.k;
            case BPF_MISC:
                if (BPF_MISCOP(insn.code) == BPF_TAX) {
                    x = a;
                } else {
                    a = x;
                }
                break;
            default:
                throw Error("seccomp program has an unknown instruction");
        }
        ++pc;
    }
    throw Error("seccomp program ends without an answer");
}

// Follows the kernel's seccomp_is_const_allow() (kernel/seccomp.c): the instructions it knows,
// and nothing else.
std::optional<uint32_t> constant_seccomp_answer(std::span<const sock_filter> program, int nr,
                                                uint32_t arch) {
    uint32_t a = 0;
    size_t pc = 0;
    while (pc < program.size()) {
        const sock_filter& insn = program[pc];
        switch (insn.code) {
            case BPF_LD | BPF_W | BPF_ABS:
                if (insn.k == offsetof(seccomp_data, nr)) {
                    a = static_cast<uint32_t>(nr);
                } else if (insn.k == offsetof(seccomp_data, arch)) {
                    a = arch;
                } else {
                    return std::nullopt;
                }
                break;
            case BPF_RET | BPF_K:
                return insn.k;
            case BPF_JMP | BPF_JA:
                pc = jump_target(pc, insn.k, program.size());
                continue;
            case BPF_JMP | BPF_JEQ | BPF_K:
            case BPF_JMP | BPF_JGE | BPF_K:
            case BPF_JMP | BPF_JGT | BPF_K:
            case BPF_JMP | BPF_JSET | BPF_K:
                pc = jump_target(pc, jump_taken(insn.code, a, insn.k) ? insn.jt : insn.jf,
                                 program.size());
                continue;
            case BPF_ALU | BPF_AND | BPF_K:
                a &= insn.k;
                break;
            default:
                return std::nullopt;
        }
        ++pc;
    }
    return std::nullopt;
}

std::optional<std::set<uint32_t>> word_boundaries(std::span<const sock_filter> program,
                                                  uint32_t offset) {
    // Whether A and X may hold the word, per instruction, over every path that reaches it
    // (classic BPF jumps only forward, so one pass in order sees every path).
    struct Holds {
        bool reached = false;
        bool a = false;
        bool x = false;
    };
    std::vector<Holds> state(program.size());
    auto flow_to = [&](size_t target, bool a, bool x) {
        if (target >= program.size()) throw Error("seccomp program jumps past its end");
        state[target].reached = true;
        state[target].a = state[target].a || a;
        state[target].x = state[target].x || x;
    };
    std::set<uint32_t> boundaries = {0};
    if (!program.empty()) state[0].reached = true;
    for (size_t pc = 0; pc < program.size(); ++pc) {
        if (!state[pc].reached) continue;
        const sock_filter& insn = program[pc];
        bool a = state[pc].a;
        bool x = state[pc].x;
        switch (BPF_CLASS(insn.code)) {
            case BPF_LD:
                if (BPF_MODE(insn.code) == BPF_ABS && BPF_SIZE(insn.code) != BPF_W) {
                    return std::nullopt;  // part of a word: not followed
                }
                a = BPF_MODE(insn.code) == BPF_ABS && insn.k == offset;
                break;
            case BPF_LDX:
                x = false;
                break;
            case BPF_ST:
            case BPF_STX:
                // Scratch memory is not followed: the word must not go there.
                if (BPF_CLASS(insn.code) == BPF_ST ? a : x) return std::nullopt;
                break;
            case BPF_ALU:
                if (a || (BPF_SRC(insn.code) == BPF_X && x)) return std::nullopt;
                break;
            case BPF_JMP: {
                if (BPF_OP(insn.code) == BPF_JA) {
                    flow_to(pc + 1 + insn.k, a, x);
                    continue;
                }
                if (BPF_SRC(insn.code) == BPF_X && (a || x)) return std::nullopt;
                if (a) {
                    if (BPF_OP(insn.code) == BPF_JSET) return std::nullopt;
                    boundaries.insert(insn.k);
                    if (insn.k != std::numeric_limits<uint32_t>::max()) {
                        boundaries.insert(insn.k + 1);
                    }
                }
                flow_to(pc + 1 + insn.jt, a, x);
                flow_to(pc + 1 + insn.jf, a, x);
                continue;
            }
            case BPF_RET:
                if (BPF_RVAL(insn.code) == BPF_A && a) return std::nullopt;
                continue;
            case BPF_MISC:
                if (BPF_MISCOP(insn.code) == BPF_TAX) {
                    x = a;
                } else {
                    a = x;
                }
                break;
            default:
                return std::nullopt;
        }
        if (pc + 1 == program.size()) throw Error("seccomp program ends without an answer");
        flow_to(pc + 1, a, x);
    }
    return boundaries;
}

}  // namespace sqbox

// Test helper: runs a classic-BPF seccomp program on a made-up system call, in user space, so
// that unit tests can ask "what would the kernel answer?" without installing the filter.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>

namespace sqbox::testing {

struct SyscallCall {
    int nr = 0;
    uint32_t arch = AUDIT_ARCH_X86_64;
    std::array<uint64_t, 6> args{};
};

// The filter's return value (SECCOMP_RET_ACTION_FULL | data).
inline uint32_t evaluate_seccomp(std::span<const sock_filter> program, const SyscallCall& call) {
    seccomp_data data{};
    data.nr = call.nr;
    data.arch = call.arch;
    for (size_t i = 0; i < 6; ++i) data.args[i] = call.args[i];
    unsigned char bytes[sizeof data];
    std::memcpy(bytes, &data, sizeof data);

    uint32_t a = 0;
    uint32_t x = 0;
    std::array<uint32_t, BPF_MEMWORDS> memory{};
    for (size_t pc = 0; pc < program.size(); ++pc) {
        const sock_filter& insn = program[pc];
        const uint32_t operand = BPF_SRC(insn.code) == BPF_X ? x : insn.k;
        switch (BPF_CLASS(insn.code)) {
            case BPF_LD:
                if (BPF_MODE(insn.code) == BPF_ABS) {
                    if (insn.k + 4 > sizeof data) throw std::runtime_error("load out of range");
                    std::memcpy(&a, bytes + insn.k, 4);
                } else if (BPF_MODE(insn.code) == BPF_IMM) {
                    a = insn.k;
                } else if (BPF_MODE(insn.code) == BPF_MEM) {
                    a = memory.at(insn.k);
                } else {
                    throw std::runtime_error("unsupported load");
                }
                break;
            case BPF_LDX:
                x = BPF_MODE(insn.code) == BPF_MEM ? memory.at(insn.k) : insn.k;
                break;
            case BPF_ST:
                memory.at(insn.k) = a;
                break;
            case BPF_STX:
                memory.at(insn.k) = x;
                break;
            case BPF_ALU:
                switch (BPF_OP(insn.code)) {
                    case BPF_ADD:
                        a += operand;
                        break;
                    case BPF_SUB:
                        a -= operand;
                        break;
                    case BPF_AND:
                        a &= operand;
                        break;
                    case BPF_OR:
                        a |= operand;
                        break;
                    case BPF_XOR:
                        a ^= operand;
                        break;
                    case BPF_LSH:
                        a <<= operand;
                        break;
                    case BPF_RSH:
                        a >>= operand;
                        break;
                    case BPF_NEG:
                        a = -a;
                        break;
                    default:
                        throw std::runtime_error("unsupported alu op");
                }
                break;
            case BPF_JMP: {
                bool taken = false;
                switch (BPF_OP(insn.code)) {
                    case BPF_JA:
                        pc += insn.k;
                        continue;
                    case BPF_JEQ:
                        taken = a == operand;
                        break;
                    case BPF_JGT:
                        taken = a > operand;
                        break;
                    case BPF_JGE:
                        taken = a >= operand;
                        break;
                    case BPF_JSET:
                        taken = (a & operand) != 0;
                        break;
                    default:
                        throw std::runtime_error("unsupported jump");
                }
                pc += taken ? insn.jt : insn.jf;
                break;
            }
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
                throw std::runtime_error("unsupported instruction class");
        }
    }
    throw std::runtime_error("program fell off its end");
}

inline uint32_t errno_result(int err) {
    return SECCOMP_RET_ERRNO | static_cast<uint32_t>(err);
}

}  // namespace sqbox::testing

#include "image/program_interpreter.h"

#include <elf.h>

#include <bit>
#include <cstdint>
#include <cstring>

namespace sqbox {
namespace {

std::optional<std::string> absolute(std::string_view path) {
    if (path.empty() || path.front() != '/') return std::nullopt;
    return std::string(path);
}

std::optional<std::string> script_interpreter(std::string_view head) {
    head.remove_prefix(2);  // "#!"
    const size_t start = head.find_first_not_of(" \t");
    if (start == std::string_view::npos) return std::nullopt;
    head.remove_prefix(start);
    const size_t end = head.find_first_of(" \t\n");
    // Without an end the line is longer than what the kernel reads: it would be cut there too.
    if (end == std::string_view::npos) return std::nullopt;
    return absolute(head.substr(0, end));
}

// Ehdr/Phdr: the ELF class's structures. Offsets are checked against `head` before any read.
template <typename Ehdr, typename Phdr>
std::optional<std::string> elf_interpreter(std::string_view head) {
    if (head.size() < sizeof(Ehdr)) return std::nullopt;
    Ehdr header;
    std::memcpy(&header, head.data(), sizeof header);
    if (header.e_phentsize != sizeof(Phdr)) return std::nullopt;
    for (size_t i = 0; i < header.e_phnum; ++i) {
        const uint64_t offset = header.e_phoff + i * sizeof(Phdr);
        if (offset > head.size() || head.size() - offset < sizeof(Phdr)) return std::nullopt;
        Phdr program;
        std::memcpy(&program, head.data() + offset, sizeof program);
        if (program.p_type != PT_INTERP) continue;
        if (program.p_offset > head.size() || head.size() - program.p_offset < program.p_filesz) {
            return std::nullopt;
        }
        std::string_view path = head.substr(program.p_offset, program.p_filesz);
        return absolute(path.substr(0, path.find('\0')));
    }
    return std::nullopt;  // statically linked
}

}  // namespace

std::optional<std::string> program_interpreter(std::string_view head) {
    if (head.starts_with("#!")) return script_interpreter(head);
    if (head.size() < EI_NIDENT || std::memcmp(head.data(), ELFMAG, SELFMAG) != 0) {
        return std::nullopt;
    }
    constexpr unsigned char kHostData =
        std::endian::native == std::endian::little ? ELFDATA2LSB : ELFDATA2MSB;
    if (static_cast<unsigned char>(head[EI_DATA]) != kHostData) return std::nullopt;
    switch (head[EI_CLASS]) {
        case ELFCLASS64:
            return elf_interpreter<Elf64_Ehdr, Elf64_Phdr>(head);
        case ELFCLASS32:
            return elf_interpreter<Elf32_Ehdr, Elf32_Phdr>(head);
        default:
            return std::nullopt;
    }
}

}  // namespace sqbox

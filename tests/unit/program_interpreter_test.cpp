#include "image/program_interpreter.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

namespace sqbox {
namespace {

TEST(ProgramInterpreter, ReadsTheScriptLine) {
    EXPECT_EQ(program_interpreter("#!/bin/sh\necho hi\n"), "/bin/sh");
    EXPECT_EQ(program_interpreter("#! /usr/bin/env python3\n"), "/usr/bin/env");
    EXPECT_EQ(program_interpreter("#!\t/bin/bash -e\n"), "/bin/bash");
}

TEST(ProgramInterpreter, DeclinesWhatTheKernelWouldNotRun) {
    EXPECT_EQ(program_interpreter("#!sh\n"), std::nullopt);     // relative
    EXPECT_EQ(program_interpreter("#!/bin/sh"), std::nullopt);  // line cut short
    EXPECT_EQ(program_interpreter("#!   \n"), std::nullopt);    // no path
    EXPECT_EQ(program_interpreter("echo hi\n"), std::nullopt);  // no "#!"
    EXPECT_EQ(program_interpreter(""), std::nullopt);
    EXPECT_EQ(program_interpreter(std::string("\x7f"
                                              "EL",
                                              3)),
              std::nullopt);
}

// A little-endian 64-bit ELF header with one PT_INTERP program header pointing at `path`.
std::string elf_with_interpreter(const std::string& path, size_t phoff = sizeof(Elf64_Ehdr)) {
    Elf64_Ehdr header{};
    std::memcpy(header.e_ident, ELFMAG, SELFMAG);
    header.e_ident[EI_CLASS] = ELFCLASS64;
    header.e_ident[EI_DATA] = ELFDATA2LSB;
    header.e_phoff = phoff;
    header.e_phentsize = sizeof(Elf64_Phdr);
    header.e_phnum = 2;
    Elf64_Phdr load{};
    load.p_type = PT_LOAD;
    Elf64_Phdr interp{};
    interp.p_type = PT_INTERP;
    interp.p_offset = phoff + 2 * sizeof(Elf64_Phdr);
    interp.p_filesz = path.size() + 1;
    std::string file(phoff, '\0');
    std::memcpy(file.data(), &header, sizeof header);
    file.append(reinterpret_cast<const char*>(&load), sizeof load);
    file.append(reinterpret_cast<const char*>(&interp), sizeof interp);
    file.append(path);
    file.push_back('\0');
    return file;
}

TEST(ProgramInterpreter, ReadsAnElfFilesLoader) {
    EXPECT_EQ(program_interpreter(elf_with_interpreter("/lib64/ld-linux-x86-64.so.2")),
              "/lib64/ld-linux-x86-64.so.2");
}

TEST(ProgramInterpreter, DeclinesElfHeadersOutsideTheHead) {
    const std::string file = elf_with_interpreter("/lib/ld.so");
    // Every cut shorter than the whole: the program headers or the path are not all there.
    for (size_t size = 0; size < file.size(); ++size) {
        EXPECT_EQ(program_interpreter(std::string_view(file).substr(0, size)), std::nullopt)
            << size;
    }
    // Program headers claimed far beyond the head (a hostile e_phoff).
    std::string far = elf_with_interpreter("/lib/ld.so");
    Elf64_Ehdr header;
    std::memcpy(&header, far.data(), sizeof header);
    header.e_phoff = ~uint64_t{0} - 8;
    std::memcpy(far.data(), &header, sizeof header);
    EXPECT_EQ(program_interpreter(far), std::nullopt);
}

TEST(ProgramInterpreter, StaticAndForeignElfHaveNone) {
    std::string file = elf_with_interpreter("/lib/ld.so");
    Elf64_Phdr interp;
    const size_t at = sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr);
    std::memcpy(&interp, file.data() + at, sizeof interp);
    interp.p_type = PT_NOTE;  // no PT_INTERP left: statically linked
    std::memcpy(file.data() + at, &interp, sizeof interp);
    EXPECT_EQ(program_interpreter(file), std::nullopt);

    std::string big_endian = elf_with_interpreter("/lib/ld.so");
    big_endian[EI_DATA] = ELFDATA2MSB;
    EXPECT_EQ(program_interpreter(big_endian), std::nullopt);
}

TEST(ProgramInterpreter, ReadsThisTestsOwnLoader) {
    std::ifstream self("/proc/self/exe", std::ios::binary);
    std::string head(kProgramHeadBytes, '\0');
    self.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(self.gcount()));
    const std::optional<std::string> loader = program_interpreter(head);
    ASSERT_TRUE(loader.has_value());
    EXPECT_TRUE(loader->starts_with("/")) << *loader;
    EXPECT_NE(loader->find("ld"), std::string::npos) << *loader;
}

}  // namespace
}  // namespace sqbox

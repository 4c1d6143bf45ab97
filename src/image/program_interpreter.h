// Which interpreter the kernel starts a program with, from the program's first bytes. The
// supervisor's look-ahead uses it to look up, ahead of the payload, the dynamic loader or script
// interpreter its command will need (runtime/look_ahead.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace sqbox {

// How much of a program to read: its first page, where a "#!" line and, in practice, an ELF
// file's program headers and loader path are.
inline constexpr size_t kProgramHeadBytes = 4096;

// The absolute path of the interpreter named by a "#!" line, or by an ELF file's PT_INTERP (its
// dynamic loader) when the program headers lie within `head`. nullopt for anything else: a
// statically linked ELF, a relative path, a header cut short, an ELF of the other byte order.
std::optional<std::string> program_interpreter(std::string_view head);

}  // namespace sqbox

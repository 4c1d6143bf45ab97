// Build-time tool: compiles the shipped seccomp profiles to BPF and writes them, with their JSON
// text, as a C++ source file (see builtin_profiles.h). Usage:
//   sqbox_precompile_profiles OUTPUT.cpp NAME=PROFILE.json...
// A profile whose rules depend on the kernel version (minKernel) cannot be compiled ahead of time
// and is refused.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "security/seccomp_filter.h"
#include "security/seccomp_profile.h"

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw sqbox::Error("cannot read " + path);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void write_profile(std::ostream& out, const std::string& name, const std::string& path) {
    const std::string text = read_file(path);
    sqbox::SeccompProfile profile = sqbox::parse_seccomp_profile(text, path);
    for (const auto& rule : profile.rules) {
        if (rule.includes.min_kernel || rule.excludes.min_kernel) {
            throw sqbox::Error(path + ":" + std::to_string(rule.line) +
                               ": minKernel makes the filter depend on the running kernel; "
                               "built-in profiles cannot use it");
        }
    }
    // No capabilities: the payload never has any. The kernel version is irrelevant (no minKernel).
    sqbox::SeccompFilter filter =
        sqbox::compile_compact_seccomp_filter(profile, sqbox::SeccompTarget{});
    if (!filter.unknown_syscalls.empty()) {
        const auto& unknown = filter.unknown_syscalls.front();
        throw sqbox::Error(path + ":" + std::to_string(unknown.line) + ": unknown system call '" +
                           unknown.name + "'");
    }
    if (text.find(")sqbox_profile\"") != std::string::npos) {
        throw sqbox::Error(path + ": contains the raw-string delimiter");
    }
    out << "constexpr std::string_view k_" << name << "_json = R\"sqbox_profile(" << text
        << ")sqbox_profile\";\n";
    out << "constexpr sock_filter k_" << name << "_program[] = {\n";
    for (const auto& insn : filter.program) {
        char line[80];
        (void)std::snprintf(line, sizeof line, "    {0x%04x, %u, %u, 0x%08x},\n", insn.code,
                            insn.jt, insn.jf, insn.k);
        out << line;
    }
    out << "};\n";
    out << "constexpr unsigned k_" << name << "_flags = " << filter.flags << ";\n";
    out << "constexpr size_t k_" << name << "_rules = " << filter.rules_applied << ";\n\n";
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::cerr << "usage: " << argv[0] << " OUTPUT.cpp NAME=PROFILE.json...\n";
        return 2;
    }
    try {
        std::ostringstream out;
        out << "// Generated at build time from seccomp-profiles/*.json; do not edit.\n"
            << "#include \"security/builtin_profiles.h\"\n\nnamespace sqbox {\nnamespace {\n\n";
        std::vector<std::string> names;
        for (int i = 2; i < argc; ++i) {
            std::string spec = argv[i];
            size_t equals = spec.find('=');
            if (equals == std::string::npos) throw sqbox::Error("expected NAME=PATH: " + spec);
            names.push_back(spec.substr(0, equals));
            write_profile(out, names.back(), spec.substr(equals + 1));
        }
        out << "constexpr BuiltinSeccompProfile kProfiles[] = {\n";
        for (const auto& name : names) {
            out << "    {\"" << name << "\", k_" << name << "_json, k_" << name << "_program, k_"
                << name << "_flags, k_" << name << "_rules},\n";
        }
        out << "};\n\n}  // namespace\n\n"
            << "const BuiltinSeccompProfile* find_builtin_seccomp_profile(std::string_view name) "
               "{\n"
            << "    for (const auto& profile : kProfiles) {\n"
            << "        if (profile.name == name) return &profile;\n"
            << "    }\n    return nullptr;\n}\n\n}  // namespace sqbox\n";
        std::ofstream file(argv[1], std::ios::binary | std::ios::trunc);
        file << out.str();
        if (!file.flush()) throw sqbox::Error(std::string("cannot write ") + argv[1]);
    } catch (const sqbox::Error& e) {
        std::cerr << argv[0] << ": " << e.what() << "\n";
        return 1;
    }
    return 0;
}

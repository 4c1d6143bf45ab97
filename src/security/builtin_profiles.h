// The seccomp profiles shipped in seccomp-profiles/, built into the binary so that sqbox is one
// self-contained file. Each is compiled to BPF at build time (by precompile_profiles.cpp), because
// compiling ~450 rules with libseccomp costs milliseconds that every sandbox start would pay.
#pragma once

#include <linux/filter.h>

#include <cstddef>
#include <span>
#include <string_view>

namespace sqbox {

struct BuiltinSeccompProfile {
    std::string_view name;  // "default", "strict"
    std::string_view json;  // the profile's text
    std::span<const sock_filter> program;
    unsigned flags = 0;
    size_t rules_applied = 0;
};

// The built-in profile called `name`, or nullptr.
const BuiltinSeccompProfile* find_builtin_seccomp_profile(std::string_view name);

}  // namespace sqbox

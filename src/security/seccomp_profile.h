// A seccomp profile in Docker's JSON format (the schema of moby's profiles/seccomp), parsed into
// plain data with the source line of every rule and syscall name kept for messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/errors.h"

namespace sqbox {

// What the filter does with a matching call, as libseccomp encodes it (SCMP_ACT_*).
struct SeccompAction {
    uint32_t libseccomp_action = 0;
    std::string name;  // as written, e.g. "SCMP_ACT_ERRNO"
};

struct SeccompArgCondition {
    unsigned index = 0;      // which system-call argument, 0..5
    uint64_t value = 0;      // for SCMP_CMP_MASKED_EQ: the mask
    uint64_t value_two = 0;  // for SCMP_CMP_MASKED_EQ: the value compared after masking
    int op = 0;              // enum scmp_compare
};

// "includes" / "excludes" of a rule.
struct SeccompRuleFilter {
    std::vector<std::string> caps;
    std::vector<std::string> arches;  // Go architecture names: amd64, arm64, x86, ...
    std::optional<std::string> min_kernel;
};

struct SeccompRule {
    std::vector<std::string> names;
    std::vector<int> name_lines;
    SeccompAction action;
    std::vector<SeccompArgCondition> args;
    SeccompRuleFilter includes;
    SeccompRuleFilter excludes;
    int line = 0;
};

struct SeccompArchMapping {
    std::string architecture;  // libseccomp name: "x86_64", "aarch64", ...
    std::vector<std::string> sub_architectures;
};

struct SeccompProfile {
    std::string origin;  // file name (or built-in name) for messages
    SeccompAction default_action;
    std::vector<std::string> architectures;  // the older "architectures" list
    std::vector<SeccompArchMapping> arch_map;
    std::vector<std::string> flags;  // SECCOMP_FILTER_FLAG_* names
    std::vector<SeccompRule> rules;
};

// A profile that cannot be used; the message starts with "<origin>:<line>: ".
class SeccompProfileError : public Error {
  public:
    using Error::Error;
};

// Parses `text` (the JSON document); throws SeccompProfileError naming `origin` and the line.
SeccompProfile parse_seccomp_profile(const std::string& text, const std::string& origin);

// Reads and parses a profile file.
SeccompProfile load_seccomp_profile_file(const std::string& path);

}  // namespace sqbox

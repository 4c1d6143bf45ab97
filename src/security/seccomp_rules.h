// A seccomp filter built rule by rule with libseccomp, for sqbox's own processes that handle
// untrusted input (the image server, the import's layer reader); the sandbox's filters come from
// profiles instead (security/seccomp_filter.h).
#pragma once

#include <seccomp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sqbox {

class SeccompRules {
  public:
    // `default_action` for every call no rule names; calls of another architecture's ABI
    // (int 0x80, x32) kill the process. `what` names the filter in errors.
    SeccompRules(uint32_t default_action, std::string what);

    // A rule for the system call `name`; skipped when this architecture has no such call.
    void add(uint32_t action, const char* name, const std::vector<scmp_arg_cmp>& conditions = {});
    // Installs the filter on the calling thread (threads started later inherit it).
    void load();

  private:
    void check(int err, const char* operation) const;

    std::string what_;
    std::unique_ptr<void, void (*)(scmp_filter_ctx)> filter_;
};

}  // namespace sqbox

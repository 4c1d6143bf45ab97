// The one set of rules for what a front end may put into a SandboxConfig: `sqbox run` options,
// the fields of a `sqbox serve` request and the enroot front end's mounts and variables all pass
// through these checks, so the same value gets the same answer and the same error text whichever
// front end it came through. Each front end only translates its own syntax (colon-separated
// arguments, JSON, fstab fields) and names the option or field (`context`) the text starts with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "sqbox/config.h"

namespace sqbox::validate {

// ---- paths ----

// An absolute path inside the sandbox, normalised ("/a//./b/" -> "/a/b"). ".." is refused rather
// than resolved: what it names depends on the sandbox's tree, which the front end cannot see.
// "CONTEXT: P must be an absolute path inside the sandbox", "CONTEXT: path P must not contain
// '..'".
std::string sandbox_path(const std::string& path, const std::string& context);

// Where a mount goes: a sandbox path other than the root itself.
std::string mount_destination(const std::string& path, const std::string& context);

// The working directory: a sandbox path.
std::string working_directory(const std::string& path, const std::string& context);

// An existing host path, made canonical (absolute, no symlinks, no "." or ".."), relative to the
// current directory. "CONTEXT: P: <reason>".
std::string host_path(const std::string& path, const std::string& context);

// The host source of a bind mount: a non-empty host_path.
std::string host_mount_source(const std::string& path, const std::string& context);

// A bind mount of the host path `source` at `destination` (source checked first); the caller sets
// its origin.
MountSpec host_bind_mount(const std::string& source, const std::string& destination, bool read_only,
                          const std::string& context);

// ---- sizes, counts, limits and times ----
// Text as a user writes it ("512M", "64", "1.5", "unlimited"); a front end whose input is typed
// (JSON) passes the value's text. Errors: "invalid value 'TEXT' for OPTION: expected ...".

std::optional<uint64_t> memory_limit(const std::string& text, const std::string& option);
std::optional<uint64_t> process_limit(const std::string& text, const std::string& option);
std::optional<uint64_t> file_size_limit(const std::string& text, const std::string& option);
std::optional<uint64_t> open_files_limit(const std::string& text, const std::string& option);
// RLIMIT_CPU counts whole seconds: a fraction is refused rather than rounded.
uint64_t cpu_time_limit(const std::string& text, const std::string& option);
double cpu_share(const std::string& text, const std::string& option);
uint64_t tmpfs_size(const std::string& text, const std::string& option);
// Zero is allowed: the payload's output is discarded.
uint64_t output_limit(const std::string& text, const std::string& option);
// The same, or "unlimited" (nullopt): for a caller that takes the output itself (sqbox run, the
// enroot front end), not for sqbox serve, which holds a request's output until it answers.
std::optional<uint64_t> output_limit_or_unlimited(const std::string& text,
                                                  const std::string& option);
// Positive seconds, at most a week (a "s" suffix is allowed).
double timeout_seconds(const std::string& text, const std::string& option);
// Whole seconds from 0 (no shared image server) to a day.
unsigned image_server_idle_seconds(const std::string& text, const std::string& option);

// ---- names ----

// 1 to 64 characters (the kernel's limit). "CONTEXT: must be 1 to 64 characters".
std::string hostname(const std::string& text, const std::string& context);

// A name the payload's environment can hold ([A-Za-z_][A-Za-z0-9_]*).
// "CONTEXT: invalid variable name 'NAME'".
void check_variable_name(const std::string& name, const std::string& context);

// "KEY=VALUE", or "KEY" alone (nullopt: the front end looks the value up in its caller's
// environment), with the name checked.
std::pair<std::string, std::optional<std::string>> variable_assignment(const std::string& text,
                                                                       const std::string& context);

// "default", "strict", "none" or a profile file: anything but empty.
std::string seccomp_profile(const std::string& text, const std::string& context);

}  // namespace sqbox::validate

// Parsing of human-written quantities on the command line ("512M", "1.5", "10s").
#pragma once

#include <cstdint>
#include <string>

namespace sqbox {

// "4096", "64k", "512M", "1G", "2T" (binary units, case-insensitive, optional trailing "B" or
// "iB"). Throws Error naming `option` on anything else, including zero when `allow_zero` is false.
uint64_t parse_size(const std::string& text, const std::string& option, bool allow_zero = false);

// A positive whole number ("100"); throws Error naming `option` otherwise.
uint64_t parse_count(const std::string& text, const std::string& option);

// Positive seconds up to a week, fractional allowed ("2.5", "2.5s"); throws Error naming `option`
// otherwise.
double parse_seconds(const std::string& text, const std::string& option);

// A positive number of CPUs, fractional allowed ("0.5"); throws Error naming `option` otherwise.
double parse_cpus(const std::string& text, const std::string& option);

}  // namespace sqbox

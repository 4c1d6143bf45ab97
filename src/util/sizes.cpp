#include "util/sizes.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <string_view>

#include "util/errors.h"

namespace sqbox {
namespace {

bool equals_ignore_case(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i]))) {
            return false;
        }
    }
    return true;
}

Error bad_value(const std::string& option, const std::string& text, const char* expected) {
    return Error("invalid value '" + text + "' for " + option + ": expected " + expected);
}

}  // namespace

uint64_t parse_size(const std::string& text, const std::string& option, bool allow_zero) {
    constexpr const char* kExpected = "a size such as 4096, 64k, 512M or 1G";
    size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
        ++digits;
    }
    if (digits == 0 || digits > 19) throw bad_value(option, text, kExpected);
    uint64_t value = std::stoull(text.substr(0, digits));
    std::string_view suffix(text);
    suffix.remove_prefix(digits);

    unsigned shift = 0;
    if (!suffix.empty()) {
        switch (std::tolower(static_cast<unsigned char>(suffix.front()))) {
            case 'k':
                shift = 10;
                break;
            case 'm':
                shift = 20;
                break;
            case 'g':
                shift = 30;
                break;
            case 't':
                shift = 40;
                break;
            case 'b':
                shift = 0;
                break;
            default:
                throw bad_value(option, text, kExpected);
        }
        std::string_view rest = suffix.substr(1);
        bool valid_rest =
            rest.empty() ||
            (shift != 0 && (equals_ignore_case(rest, "b") || equals_ignore_case(rest, "ib")));
        if (!valid_rest) throw bad_value(option, text, kExpected);
    }
    if (shift != 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
        throw bad_value(option, text, kExpected);
    }
    value <<= shift;
    if (value == 0 && !allow_zero) throw bad_value(option, text, "a size greater than zero");
    return value;
}

uint64_t parse_count(const std::string& text, const std::string& option) {
    constexpr const char* kExpected = "a positive whole number";
    if (text.empty() || text.size() > 19) throw bad_value(option, text, kExpected);
    for (char c : text) {
        if (!std::isdigit(static_cast<unsigned char>(c))) throw bad_value(option, text, kExpected);
    }
    uint64_t value = std::stoull(text);
    if (value == 0) throw bad_value(option, text, kExpected);
    return value;
}

namespace {

// A positive decimal, optionally followed by `suffix`; `expected` names it in the error.
double parse_positive_decimal(const std::string& text, const std::string& option,
                              std::string_view suffix, const char* expected, double maximum) {
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        throw bad_value(option, text, expected);
    }
    std::string_view rest = std::string_view(text).substr(used);
    if (!suffix.empty() && rest == suffix) rest = {};
    if (!rest.empty() || !std::isfinite(value) || value <= 0 || value > maximum) {
        throw bad_value(option, text, expected);
    }
    return value;
}

}  // namespace

double parse_cpus(const std::string& text, const std::string& option) {
    return parse_positive_decimal(text, option, "", "a positive number of CPUs, such as 0.5 or 2",
                                  4096);
}

double parse_seconds(const std::string& text, const std::string& option) {
    // At most a week: `sqbox serve` waits for deadlines in int milliseconds (poll), which a
    // longer time would overflow.
    constexpr double kWeek = 7 * 24 * 3600;
    return parse_positive_decimal(text, option, "s", "a positive number of seconds, at most a week",
                                  kWeek);
}

}  // namespace sqbox

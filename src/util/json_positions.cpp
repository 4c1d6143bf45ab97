#include "util/json_positions.h"

#include <algorithm>

namespace sqbox {
namespace {

// A minimal walk over already-validated JSON: it only has to find where values start.
class PositionScanner {
  public:
    explicit PositionScanner(std::string_view text) : text_(text) {}

    std::unordered_map<std::string, int> scan() {
        skip_space();
        value("");
        return std::move(lines_);
    }

  private:
    void skip_space() {
        while (pos_ < text_.size()) {
            char c = text_[pos_];
            if (c == '\n') {
                ++line_;
            } else if (c != ' ' && c != '\t' && c != '\r') {
                return;
            }
            ++pos_;
        }
    }

    // Returns the raw contents of the string at pos_ (escapes left as written) and moves past it.
    std::string_view string_token() {
        size_t start = ++pos_;  // opening quote
        while (pos_ < text_.size() && text_[pos_] != '"') pos_ += text_[pos_] == '\\' ? 2 : 1;
        std::string_view raw = text_.substr(start, pos_ - start);
        ++pos_;  // closing quote
        return raw;
    }

    static std::string pointer_token(std::string_view raw) {
        std::string token;
        for (char c : raw) {
            if (c == '~') {
                token += "~0";
            } else if (c == '/') {
                token += "~1";
            } else {
                token += c;
            }
        }
        return token;
    }

    void value(const std::string& pointer) {
        lines_.emplace(pointer, line_);
        if (pos_ >= text_.size()) return;
        char c = text_[pos_];
        if (c == '{') {
            ++pos_;
            for (skip_space(); pos_ < text_.size() && text_[pos_] != '}';) {
                std::string key = pointer_token(string_token());
                skip_space();
                ++pos_;  // ':'
                skip_space();
                value(pointer + "/" + key);
                skip_space();
                if (pos_ < text_.size() && text_[pos_] == ',') ++pos_;
                skip_space();
            }
            ++pos_;
        } else if (c == '[') {
            ++pos_;
            size_t index = 0;
            for (skip_space(); pos_ < text_.size() && text_[pos_] != ']';) {
                value(pointer + "/" + std::to_string(index++));
                skip_space();
                if (pos_ < text_.size() && text_[pos_] == ',') ++pos_;
                skip_space();
            }
            ++pos_;
        } else if (c == '"') {
            (void)string_token();
        } else {
            while (pos_ < text_.size() &&
                   std::string_view(",]} \t\r\n").find(text_[pos_]) == std::string_view::npos) {
                ++pos_;
            }
        }
    }

    std::string_view text_;
    size_t pos_ = 0;
    int line_ = 1;
    std::unordered_map<std::string, int> lines_;
};

}  // namespace

std::unordered_map<std::string, int> json_value_lines(std::string_view text) {
    return PositionScanner(text).scan();
}

int line_of_offset(std::string_view text, size_t offset) {
    offset = std::min(offset, text.size());
    return 1 + static_cast<int>(std::count(
                   text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

}  // namespace sqbox

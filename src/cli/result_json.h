// The --json result record.
#pragma once

#include <string>

#include "sqbox/result.h"
#include "util/unique_fd.h"

namespace sqbox::cli {

// Renders `result` as one JSON object (docs/run.md documents the fields).
std::string result_to_json(const RunResult& result);

// A result file opened up front (so a bad path fails before the sandbox runs) and written once.
class JsonResultFile {
  public:
    explicit JsonResultFile(const std::string& path);  // throws Error
    bool write(const RunResult& result);

  private:
    std::string path_;
    UniqueFd fd_;
};

}  // namespace sqbox::cli

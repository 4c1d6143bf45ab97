// The session requests beside exec, put, get and tools (PROTOCOL.md, "Files", "Shells"): what
// the server checks of them and passes on to the driver.
//
// Directory transfers are tar streams cut into chunks; the server counts each stream against the
// sandbox's writable budget (--tmpfs-size) in both directions, the download's as the driver
// answers: the driver shares its process with the session's code, so its own count is not
// trusted to stop a stream that would not end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "session/protocol_lines.h"
#include "util/errors.h"

namespace sqbox {

// A transfer that would pass the budget: answered with the error type "TooLarge".
class TransferTooLarge : public Error {
  public:
    using Error::Error;
};

// upload, download, shell or shell_close.
bool is_session_extra_op(std::string_view op);

// The driver's request for one of those (without "seq"), from the client's. `budget` is the
// sandbox's writable bytes, `output_limit` the session's default cap per stream of a shell
// command. A shell command's timeout goes to `timeout` (the server's own deadline is later: the
// driver enforces it). Throws Error for a malformed request, TransferTooLarge past the budget.
json session_extra_request(const json& request, uint64_t budget, uint64_t output_limit,
                           std::optional<double>& timeout);

// A download answer's chunk ends within the budget (a request at `offset`); false if not, or if
// its data is not a string.
bool download_answer_within_budget(const json& answer, uint64_t offset, uint64_t budget);

// The number of bytes `text` decodes to as base64, at most (padding counted, not validated).
uint64_t base64_decoded_size(std::string_view text);

// How long after a shell command's own timeout the server interrupts the driver (which has
// interrupted the command and killed what it started by then).
inline constexpr double kShellTimeoutGraceSeconds = 5;

}  // namespace sqbox

// Pre-started interpreters of `sqbox serve` (docs/serve.md, "Pre-started interpreters"): sandboxes
// whose python3 has started and imported the configured modules before any request exists, each
// waiting for the one `run_python` request it will serve (src/session/prestart.py inside). This
// file holds what the server and the interpreter agree on; jobs.cpp keeps the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "session/protocol_lines.h"
#include "sqbox/config.h"

namespace sqbox {

// src/session/prestart.py, built into the binary.
std::string_view prestart_stub_source();

// src/session/python_c.py (running code as `python3 -c` does), built into the binary.
std::string_view python_c_source();

// The program `python3 -c` runs for an interpreter started ahead of its request: python_c.py,
// then `stub` (prestart.py's or zygote.py's).
std::string python_stub_program(std::string_view stub);

// Throws Error unless `name` is a dotted Python module name ("json", "email.mime.text").
void check_preload_module(const std::string& name);

// The payload's command: python3 running the stub, which imports `preload` in order.
std::vector<std::string> prestart_command(const std::vector<std::string>& preload);

// Whether a run_python request can be served by an interpreter started before it: not when it
// asks for its own mounts, memory or pids (the sandbox exists already), nor when its env sets a
// variable the interpreter reads as it starts (PYTHON*, LC_*, LANG, LANGUAGE, HOME, PATH, TZ).
// Those get a `python3 -c` of their own, as a run would.
bool prestarted_can_serve(const json& request);

// What the server writes on the interpreter's stdin ahead of the request's own stdin: the code,
// the working directory (empty: where the sandbox started), the environment additions and the
// cpu_time limit, framed as prestart.py reads them.
std::string prestart_request_frame(
    std::string_view code, std::string_view workdir,
    const std::vector<std::pair<std::string, std::string>>& environment,
    std::optional<uint64_t> cpu_seconds);

// The interpreter's stdout before the request: everything up to and including its ready line
// ("sqbox-prestart-ready CPU_NS\n"), which is not the request's output. Anything an import printed
// before it is dropped.
class PrestartReadiness {
  public:
    // Takes stdout bytes until the ready line has been seen; returns what follows it in `chunk`
    // (the request's output), or nothing while still waiting.
    std::string_view take(std::string_view chunk);
    bool ready() const { return cpu_ns_.has_value(); }
    // The interpreter's CPU time when it was ready (its start and the imports).
    uint64_t cpu_ns() const { return cpu_ns_.value_or(0); }

  private:
    std::string pending_;
    std::optional<uint64_t> cpu_ns_;
};

}  // namespace sqbox

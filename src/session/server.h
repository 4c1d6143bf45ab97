// `sqbox serve IMAGE`: a long-lived server for one image that starts sandboxes on request and
// keeps Python sessions alive, speaking the line-delimited JSON protocol of PROTOCOL.md on its
// stdin/stdout and, with a socket path, on a Unix socket.
//
// One process, one poll loop, no threads: it reads requests, hands each sandbox's configuration
// and stdio to the warm supervisor (warm_supervisor.h), collects output, relays session traffic
// between clients and the in-sandbox drivers, and answers.
//
// server.cpp holds the lifetime (start-up, the loop, signals, the end) and the wiring between
//   client_connection.h  a client's framing: bounded request lines, buffered answers
//   jobs.h               the sandboxes: launching, stdio, run answers, the pool, --max-parallel
//   session_state.h      a session's state machine (tested without sandboxes)
//   protocol_lines.h     the JSON line format they share
#pragma once

#include <string>
#include <vector>

#include "sqbox/config.h"

namespace sqbox {

struct ServeOptions {
    SandboxConfig base;                // image, ids, default limits and profile of every sandbox
    std::string socket_path;           // also listen here (mode 0600); empty: stdin/stdout only
    unsigned max_parallel = 0;         // running `run` sandboxes at once; 0: twice the CPU count
    unsigned pool = 0;                 // sandboxes kept set up ahead for run requests (--pool)
    unsigned prestart = 0;             // interpreters kept started for run_python (--prestart)
    std::vector<std::string> preload;  // ...having imported these modules (--preload)
    bool zygote = false;  // run_python in sandboxes forked from one warm interpreter (--zygote)
};

// Runs until shutdown; returns the process's exit status (125 when the image cannot be served).
int run_server(const ServeOptions& options);

}  // namespace sqbox

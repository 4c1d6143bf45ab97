// One client of `sqbox serve`: the server's own stdin/stdout, or a connection on its socket.
// Requests arrive as lines of bounded size; answers are buffered and written as the client reads
// them, so that a slow reader holds up nobody else.
#pragma once

#include <string>

#include "session/protocol_lines.h"
#include "util/unique_fd.h"

namespace sqbox {

class ClientConnection {
  public:
    // The server's stdin and stdout, made non-blocking. The connection does not own them.
    static ClientConnection stdio();
    // A socket connection (non-blocking), which the connection owns.
    explicit ClientConnection(UniqueFd socket);

    int in_fd() const { return in_fd_; }
    int out_fd() const { return out_fd_; }
    bool is_socket() const { return socket_.get() >= 0; }

    // ---- requests ----

    bool input_closed() const { return input_closed_; }
    // Reads what has arrived, using `scratch` (its size is the most read at once); EOF or an
    // error closes the input.
    void read_available(std::string& scratch);
    // The next complete request line (maybe empty); false when none is left.
    bool next_line(std::string& line) { return input_.next_line(line); }
    // Once the complete lines are taken: true when what remains is already longer than any
    // request may be. The input is then dropped and closed.
    bool drop_oversized_input();

    // ---- answers ----

    // Queues a message and writes what the client takes now. Dropped once the client is broken.
    void send(const json& message);
    // Writes what the client takes without waiting; a failed write makes the client broken.
    void flush();
    // The descriptor is writable or reports an error (POLLERR or POLLHUP without POLLOUT: the
    // reader is gone).
    void output_ready(short revents);
    bool has_output() const { return !output_.empty(); }
    // Bytes queued that the client has not taken yet.
    size_t pending_output() const { return output_.size(); }
    // At the end: waits until what is queued is written, or the write fails.
    void flush_blocking();
    // A write failed: nobody reads any more.
    bool broken() const { return broken_; }

    // Nothing more to do with it: broken, or a socket client that closed its side and has
    // everything it was sent. The stdio client stays while its stdout works.
    bool gone() const;

  private:
    ClientConnection(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {}

    int in_fd_ = -1;
    int out_fd_ = -1;
    UniqueFd socket_;  // socket clients own their descriptor; the stdio client does not
    LineBuffer input_;
    std::string output_;
    bool input_closed_ = false;
    bool broken_ = false;
};

}  // namespace sqbox

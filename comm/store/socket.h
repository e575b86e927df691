// Blocking TCP helpers with deadlines, for the rendezvous store. Internal to
// comm/ (the transports move data with UCX or NCCL, not with these).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace gz::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

/// Listens on host:port (port 0 picks a free one). The address must be one of
/// this machine's (127.0.0.1 in tests). Throws IoError.
Fd listen_tcp(const std::string& host, int port, int backlog = 128);

/// The port a listening socket is bound to.
int bound_port(int fd);

/// Connects to host:port, retrying while the server is not up yet, until
/// `deadline`. Throws IoError naming the address and the last error.
Fd connect_tcp(const std::string& host, int port, Deadline deadline);

/// Writes all bytes, or throws IoError (peer closed, error, deadline).
void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline);

/// Reads exactly `bytes`, or throws IoError (peer closed, error, deadline).
void read_exact(int fd, void* data, std::size_t bytes, Deadline deadline);

/// Makes fd non-blocking (server side).
void set_nonblocking(int fd);

}  // namespace gz::net

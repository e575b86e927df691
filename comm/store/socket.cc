#include "comm/store/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "common/error.h"

namespace gz::net {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) GZ_THROW(IoError, "cannot resolve '", host, ":", port, "': ", gai_strerror(rc));
  return AddrInfoPtr(res);
}

int remaining_ms(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000 * 1000 ? 1000 * 1000 : static_cast<int>(left);
}

// Waits until fd is ready for `events`; false on deadline.
bool wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) GZ_THROW(IoError, "poll failed: ", std::strerror(errno));
  }
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    GZ_THROW(IoError, "fcntl(O_NONBLOCK) failed: ", std::strerror(errno));
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  const AddrInfoPtr res = resolve(host, port, true);
  std::string last = "no address";
  for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.get(), backlog) == 0) return fd;
    last = std::strerror(errno);
  }
  GZ_THROW(IoError, "cannot listen on ", host, ":", port, ": ", last);
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    GZ_THROW(IoError, "getsockname failed: ", std::strerror(errno));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

Fd connect_tcp(const std::string& host, int port, Deadline deadline) {
  std::string last = "timed out";
  auto backoff = std::chrono::milliseconds(10);
  do {
    const AddrInfoPtr res = resolve(host, port, false);
    for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd) {
        last = std::strerror(errno);
        continue;
      }
      set_nonblocking(fd.get());
      int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        if (!wait_ready(fd.get(), POLLOUT, deadline)) {
          last = "connect timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        // Back to blocking: reads and writes below poll with their own deadlines.
        const int flags = ::fcntl(fd.get(), F_GETFL, 0);
        ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last = std::strerror(errno);
    }
    // The server (rank 0) may not be listening yet: retry until the deadline.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  } while (Clock::now() < deadline);
  GZ_THROW(IoError, "cannot connect to the store at ", host, ":", port, ": ", last,
           " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?)");
}

void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLOUT, deadline)) GZ_THROW(IoError, "write to the store timed out");
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      GZ_THROW(IoError, "write to the store failed: ", std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void read_exact(int fd, void* data, std::size_t bytes, Deadline deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) GZ_THROW(IoError, "read from the store timed out");
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n == 0) GZ_THROW(IoError, "the store closed the connection (did rank 0 exit or fail?)");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      GZ_THROW(IoError, "read from the store failed: ", std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace gz::net

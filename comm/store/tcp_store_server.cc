// TcpStore, the server half: one thread, poll() over the listening socket and
// every connection, non-blocking reads and writes with per-connection
// buffers. A wait that cannot be answered yet parks its connection (requests
// on a connection are answered in order) until a set completes it or its
// deadline passes.
//
// Defences against a stray or malicious client, each bounded before any
// allocation: frame magic and length (store_protocol.h), key/value/key-count
// limits, a cap on connections, on bytes stored and on unread replies. A
// violation closes that connection only.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"

namespace gz {

namespace sp = store_proto;

namespace {

constexpr std::size_t kMaxConnections = 1024;
constexpr std::size_t kMaxStoredBytes = 256u << 20;
constexpr std::size_t kMaxKeys = 1u << 20;
constexpr std::size_t kMaxUnsentReply = 16u << 20;

struct Conn {
  net::Fd fd;
  std::string in, out;
  bool waiting = false;
  std::vector<std::string> wait_keys;
  net::Clock::time_point wait_deadline;
  bool dead = false;
};

}  // namespace

struct TcpStoreServer::Impl {
  net::Fd listener;
  net::Fd wake_r, wake_w;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> rejected{0};

  std::map<std::string, std::string, std::less<>> data;
  std::size_t stored_bytes = 0;
  std::list<Conn> conns;

  void run();
  void accept_all();
  void read_from(Conn& c);
  void flush(Conn& c);
  void process(Conn& c);
  void handle(Conn& c, std::string_view body);
  void reject(Conn& c) {
    c.dead = true;
    ++rejected;
  }
  void reply(Conn& c, sp::Status status, std::string_view payload = {}) {
    std::string body;
    bytes::Writer(body).put(static_cast<std::uint8_t>(status));
    body.append(payload);
    c.out += sp::frame(body);
    if (c.out.size() > kMaxUnsentReply) {
      reject(c);  // the client does not read its replies
      return;
    }
    flush(c);
  }
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data.count(k)) m.push_back(k);
    return m;
  }
  void wake_waiters();
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  impl_->listener = net::listen_tcp(host, port);
  net::set_nonblocking(impl_->listener.get());
  port_ = net::bound_port(impl_->listener.get());
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) GZ_THROW(IoError, "pipe failed: ", std::strerror(errno));
  impl_->wake_r = net::Fd(p[0]);
  impl_->wake_w = net::Fd(p[1]);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  const char b = 1;
  [[maybe_unused]] const auto rc = ::write(impl_->wake_w.get(), &b, 1);
  impl_->thread.join();
}

std::size_t TcpStoreServer::rejected() const { return impl_->rejected.load(); }

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  while (!stop) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_r.get(), POLLIN, 0});
    fds.push_back({listener.get(), POLLIN, 0});
    int timeout_ms = -1;
    const auto now = net::Clock::now();
    for (auto& c : conns) {
      fds.push_back({c.fd.get(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      polled.push_back(&c);
      if (c.waiting) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.wait_deadline - now).count() + 1;
        const int ms = left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }
    const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) return;  // cannot happen with valid fds; stop serving
    if (stop) return;
    if (fds[1].revents) accept_all();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      Conn& c = *polled[i];
      const short ev = fds[i + 2].revents;
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      if (!c.dead && (ev & POLLOUT)) flush(c);
    }
    // Waits whose deadline passed: answer with the keys still missing.
    const auto t = net::Clock::now();
    for (auto& c : conns) {
      if (c.dead || !c.waiting || c.wait_deadline > t) continue;
      const auto m = missing(c.wait_keys);
      std::string payload;
      bytes::Writer w(payload);
      w.put(static_cast<std::uint32_t>(m.size()));
      for (const auto& k : m) w.str(k);
      c.waiting = false;
      c.wait_keys.clear();
      reply(c, sp::Status::Timeout, payload);
      process(c);
    }
    conns.remove_if([](const Conn& c) { return c.dead; });
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    net::Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;  // EAGAIN, or a transient error: poll again
    if (conns.size() >= kMaxConnections) {
      ++rejected;
      continue;  // closed by Fd's destructor
    }
    conns.emplace_back();
    conns.back().fd = std::move(fd);
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n == 0) {
      c.dead = true;  // orderly close
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
      break;
    }
    c.in.append(buf, static_cast<std::size_t>(n));
    // One frame at most is buffered beyond the one being answered.
    if (c.in.size() > 2 * (sp::kFrameHeader + sp::kMaxFrameBody)) {
      reject(c);
      return;
    }
    process(c);
    if (c.dead) return;
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
      return;
    }
    c.out.erase(0, static_cast<std::size_t>(n));
  }
}

void TcpStoreServer::Impl::process(Conn& c) {
  while (!c.dead && !c.waiting && c.in.size() >= sp::kFrameHeader) {
    bytes::Reader r(std::string_view(c.in).substr(0, sp::kFrameHeader));
    const std::uint32_t magic = r.get<std::uint32_t>(), len = r.get<std::uint32_t>();
    if (magic != sp::kMagic || len == 0 || len > sp::kMaxFrameBody) {
      reject(c);
      return;
    }
    if (c.in.size() < sp::kFrameHeader + len) return;
    const std::string body = c.in.substr(sp::kFrameHeader, len);
    c.in.erase(0, sp::kFrameHeader + len);
    handle(c, body);
  }
}

void TcpStoreServer::Impl::handle(Conn& c, std::string_view body) {
  bytes::Reader r(body);
  const auto op = static_cast<sp::Op>(r.get<std::uint8_t>());
  switch (op) {
    case sp::Op::Set: {
      const std::string_view key = r.str(sp::kMaxKey), value = r.str(sp::kMaxValue);
      if (!r.ok() || !r.at_end() || key.empty()) return reject(c);
      auto it = data.find(key);
      const std::size_t old = it == data.end() ? 0 : key.size() + it->second.size();
      if (stored_bytes - old + key.size() + value.size() > kMaxStoredBytes ||
          (it == data.end() && data.size() >= kMaxKeys))
        return reply(c, sp::Status::Error, "store is full");
      if (it == data.end()) it = data.emplace(std::string(key), std::string()).first;
      it->second.assign(value);
      stored_bytes = stored_bytes - old + key.size() + value.size();
      reply(c, sp::Status::Ok);
      wake_waiters();
      return;
    }
    case sp::Op::Get: {
      const std::string_view key = r.str(sp::kMaxKey);
      if (!r.ok() || !r.at_end() || key.empty()) return reject(c);
      const auto it = data.find(key);
      if (it == data.end()) return reply(c, sp::Status::Error, "no such key");
      return reply(c, sp::Status::Ok, it->second);
    }
    case sp::Op::Wait: {
      const std::uint32_t ms = r.get<std::uint32_t>(), count = r.get<std::uint32_t>();
      if (!r.ok() || count == 0 || count > sp::kMaxWaitKeys) return reject(c);
      std::vector<std::string> keys;
      keys.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        const std::string_view k = r.str(sp::kMaxKey);
        if (!r.ok() || k.empty()) return reject(c);
        keys.emplace_back(k);
      }
      if (!r.at_end()) return reject(c);
      if (missing(keys).empty()) return reply(c, sp::Status::Ok);
      c.waiting = true;
      c.wait_keys = std::move(keys);
      c.wait_deadline = net::Clock::now() + std::chrono::milliseconds(ms);
      return;
    }
    case sp::Op::Add: {
      const std::string_view key = r.str(sp::kMaxKey);
      const std::int64_t delta = r.get<std::int64_t>();
      if (!r.ok() || !r.at_end() || key.empty()) return reject(c);
      auto it = data.find(key);
      std::int64_t v = 0;
      if (it != data.end()) {
        const auto& s = it->second;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size())
          return reply(c, sp::Status::Error, "value is not a counter");
      } else {
        if (data.size() >= kMaxKeys) return reply(c, sp::Status::Error, "store is full");
        it = data.emplace(std::string(key), std::string()).first;
        stored_bytes += key.size();
      }
      v += delta;
      stored_bytes -= it->second.size();
      it->second = std::to_string(v);
      stored_bytes += it->second.size();
      std::string payload;
      bytes::Writer(payload).put(v);
      reply(c, sp::Status::Ok, payload);
      wake_waiters();
      return;
    }
  }
  reject(c);  // unknown op
}

void TcpStoreServer::Impl::wake_waiters() {
  std::vector<Conn*> ready;
  for (auto& c : conns)
    if (!c.dead && c.waiting && missing(c.wait_keys).empty()) ready.push_back(&c);
  for (Conn* c : ready) {
    c->waiting = false;
    c->wait_keys.clear();
    reply(*c, sp::Status::Ok);
  }
  // Requests that queued behind those waits (answered after the replies above).
  for (Conn* c : ready) process(*c);
}

}  // namespace gz

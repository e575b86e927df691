// TcpStore, the server half: one thread, poll() over the listening socket and
// every connection, non-blocking reads and writes with per-connection
// buffers. A wait that cannot be answered yet parks its connection (requests
// on a connection are answered in order) until a set completes it or its
// deadline passes.
//
// Who gets in: a new connection is sent a challenge and must answer with a
// hello of this job (store_handshake.h) within the handshake timeout, in a
// frame of at most store_hs::kMaxBody bytes (517). Until then it is a stranger:
// strangers have a budget of their own (max_strangers connections, the oldest
// evicted when a new one arrives), so no number of idle or junk connections
// can lock a rank out. Members are admitted one connection per rank.
//
// Bounds (TcpStoreLimits and below), each checked before anything is
// allocated: frame magic and length, key/value/key-count limits
// (store_protocol.h); bytes stored and keys; the bytes buffered per
// connection and across all connections (in-flight frames and unread
// replies: max_buffered); a frame begun and not finished within the stall
// timeout. A violation closes that connection only. Running out
// of file descriptors evicts a stranger (or drops the new connection) instead
// of spinning on a listener that stays readable.
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "comm/security/crypto.h"
#include "comm/store/store_handshake.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"

namespace gz {

namespace sp = store_proto;
using namespace std::chrono_literals;

namespace {

constexpr net::Clock::duration kRefusalLinger = 1s;
constexpr net::Clock::duration kListenerBackoff = 100ms;
constexpr std::size_t kMaxStoredBytes = 256u << 20;
constexpr std::size_t kMaxKeys = 1u << 20;
constexpr std::size_t kMaxUnsentReply = 16u << 20;

enum class Phase { Stranger, Member, Closing };

struct Conn {
  net::Fd fd;
  std::string peer;   // "address:port", for the log
  Phase phase = Phase::Stranger;
  std::string nonce;  // the challenge's
  int rank = -1;      // a member's
  std::string in, out;
  bool waiting = false;
  std::vector<std::string> wait_keys;
  net::Clock::time_point wait_deadline;
  net::Clock::time_point deadline;       // Stranger: the handshake's; Closing: the linger's
  net::Clock::time_point last_received;  // for the stall check
  bool dead = false;
};

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Refusals go to stderr, at most one line a second (a flood must not flood
// the log): the first of each second is printed with the count held back.
class RefusalLog {
 public:
  void add(const std::string& peer, const std::string& why) {
    const auto now = net::Clock::now();
    if (now - last_ < 1s) {
      ++held_;
      return;
    }
    std::fprintf(stderr, "gradzip store: refused %s: %s", peer.c_str(), why.c_str());
    if (held_) std::fprintf(stderr, " (and %zu more refusals since the last message)", held_);
    std::fputc('\n', stderr);
    last_ = now;
    held_ = 0;
  }

 private:
  net::Clock::time_point last_{};
  std::size_t held_ = 0;
};

}  // namespace

struct TcpStoreServer::Impl {
  TcpStoreLimits limits;
  JobIdentity job;
  int world_size = 1;
  net::Fd listener;
  net::Fd reserve;  // a spare descriptor, given up to accept-and-drop when none is left
  net::Fd wake_r, wake_w;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> rejected{0};
  std::atomic<std::size_t> buffered_peak{0};
  net::Clock::time_point listener_paused_until{};
  RefusalLog log;

  std::map<std::string, std::string, std::less<>> data;
  std::size_t stored_bytes = 0;
  std::size_t buffered = 0;  // in + out over every connection
  std::list<Conn> conns;     // in accept order: the first stranger is the oldest
  std::vector<Conn*> members;

  void run();
  int poll_timeout_ms(net::Clock::time_point now) const;
  void accept_all();
  void admit(net::Fd fd);
  bool evict_oldest_stranger(const char* why);
  void read_from(Conn& c);
  void flush(Conn& c);
  void process(Conn& c);
  void handshake(Conn& c, std::string_view body);
  void handle(Conn& c, std::string_view body);
  void expire(net::Clock::time_point now);

  void close(Conn& c) {
    if (c.dead) return;
    c.dead = true;
    buffered -= c.in.size() + c.out.size();
    c.in = std::string();
    c.out = std::string();
    if (c.phase == Phase::Member) members[static_cast<std::size_t>(c.rank)] = nullptr;
  }
  // A protocol violation or a refusal: logged, counted, closed.
  void reject(Conn& c, const std::string& why) {
    if (c.dead) return;
    log.add(c.peer, why);
    ++rejected;
    close(c);
  }
  // Refused after a well-formed hello: the client is told why, then closed.
  void refuse(Conn& c, const std::string& why) {
    log.add(c.peer, why);
    ++rejected;
    send(c, store_hs::encode_refusal(why));
    c.phase = Phase::Closing;
    c.deadline = net::Clock::now() + kRefusalLinger;
    flush(c);
  }
  bool send(Conn& c, std::string_view body) {
    const std::size_t bytes = sp::kFrameHeader + body.size();
    if (c.out.size() + bytes > kMaxUnsentReply) {
      reject(c, "does not read its replies");
      return false;
    }
    if (buffered + bytes > limits.max_buffered) {
      reject(c, "the store's buffers are full (" + std::to_string(limits.max_buffered >> 20) + " MiB)");
      return false;
    }
    c.out += sp::frame(body);
    note_buffered(bytes);
    return true;
  }
  void note_buffered(std::size_t added) {
    buffered += added;
    if (buffered > buffered_peak.load(std::memory_order_relaxed)) buffered_peak = buffered;
  }
  void reply(Conn& c, sp::Status status, std::string_view payload = {}) {
    std::string body;
    bytes::Writer(body).put(static_cast<std::uint8_t>(status));
    body.append(payload);
    if (send(c, body)) flush(c);
  }
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data.count(k)) m.push_back(k);
    return m;
  }
  void wake_waiters();
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, JobIdentity job, int world_size,
                               TcpStoreLimits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  GZ_ENFORCE(world_size >= 1, "a store serves a job of at least one rank, got ", world_size);
  impl_->job = std::move(job);
  impl_->world_size = world_size;
  impl_->members.assign(static_cast<std::size_t>(world_size), nullptr);
  try {
    impl_->listener = net::listen_tcp(host, port);
  } catch (const IoError& e) {
    GZ_THROW(IoError, e.what(), " (if the address is in use: another job's store or another program holds the "
                                "port; give each job its own MASTER_PORT)");
  }
  net::set_nonblocking(impl_->listener.get());
  port_ = net::bound_port(impl_->listener.get());
  impl_->reserve = net::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
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
std::size_t TcpStoreServer::buffered_peak() const { return impl_->buffered_peak.load(); }

int TcpStoreServer::Impl::poll_timeout_ms(net::Clock::time_point now) const {
  net::Clock::time_point next = net::Clock::time_point::max();
  auto consider = [&](net::Clock::time_point t) { next = std::min(next, t); };
  if (listener_paused_until > now) consider(listener_paused_until);
  for (const auto& c : conns) {
    if (c.phase != Phase::Member) consider(c.deadline);
    if (c.waiting) consider(c.wait_deadline);
    if (c.phase == Phase::Member && !c.waiting && !c.in.empty()) consider(c.last_received + limits.stall_timeout);
  }
  if (next == net::Clock::time_point::max()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1 << 30));
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  while (!stop) {
    fds.clear();
    polled.clear();
    const auto now = net::Clock::now();
    fds.push_back({wake_r.get(), POLLIN, 0});
    fds.push_back({listener.get(), static_cast<short>(listener_paused_until > now ? 0 : POLLIN), 0});
    for (auto& c : conns) {
      fds.push_back({c.fd.get(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      polled.push_back(&c);
    }
    const int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(now));
    if (rc < 0 && errno != EINTR) return;  // cannot happen with valid fds; stop serving
    if (stop) return;
    if (fds[1].revents) accept_all();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      Conn& c = *polled[i];
      const short ev = fds[i + 2].revents;
      if (!c.dead && (ev & (POLLIN | POLLHUP | POLLERR))) read_from(c);
      if (!c.dead && (ev & POLLOUT)) flush(c);
    }
    expire(net::Clock::now());
    conns.remove_if([](const Conn& c) { return c.dead; });
  }
}

// Deadlines: handshakes and lingering refusals end; stalled frames are cut;
// waits whose time passed are answered with the keys still missing.
void TcpStoreServer::Impl::expire(net::Clock::time_point now) {
  for (auto& c : conns) {
    if (c.dead) continue;
    if (c.phase == Phase::Stranger && now >= c.deadline) {
      reject(c, "no handshake within " + std::to_string(limits.handshake_timeout.count()) + " ms");
      continue;
    }
    if (c.phase == Phase::Closing && now >= c.deadline) {
      close(c);
      continue;
    }
    if (c.phase == Phase::Member && !c.waiting && !c.in.empty() && now - c.last_received >= limits.stall_timeout) {
      reject(c, "rank " + std::to_string(c.rank) + " left a frame unfinished for " +
                    std::to_string(limits.stall_timeout.count()) + " ms");
      continue;
    }
    if (!c.waiting || c.wait_deadline > now) continue;
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
}

bool TcpStoreServer::Impl::evict_oldest_stranger(const char* why) {
  for (auto& c : conns)
    if (!c.dead && c.phase != Phase::Member) {
      reject(c, why);
      c.fd.reset();  // now: the descriptor may be what the caller needs
      return true;
    }
  return false;
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    net::Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd) {
      admit(std::move(fd));
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    if (err == EMFILE || err == ENFILE) {
      // Out of descriptors: a stranger makes room; failing that the spare
      // descriptor takes the connection, which is dropped. Either way the
      // pending connection leaves the queue, so poll does not spin on it.
      if (evict_oldest_stranger("evicted: the store ran out of file descriptors")) continue;
      if (reserve) {
        reserve.reset();
        net::Fd dropped(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        const bool took = static_cast<bool>(dropped);
        const int again = !took && (errno == EAGAIN || errno == EWOULDBLOCK);
        if (took) {
          log.add(peer_name(dropped.get()), "the store is out of file descriptors");
          ++rejected;
        }
        dropped.reset();
        reserve = net::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (took && reserve) continue;
        if (again && reserve) return;
      }
    }
    // ENOBUFS, ENOMEM, or no spare descriptor: try again a little later.
    listener_paused_until = net::Clock::now() + kListenerBackoff;
    return;
  }
}

void TcpStoreServer::Impl::admit(net::Fd fd) {
  std::size_t strangers = 0;
  for (const auto& c : conns) strangers += !c.dead && c.phase != Phase::Member;
  if (strangers >= limits.max_strangers) evict_oldest_stranger("evicted: too many connections in the handshake");
  const auto now = net::Clock::now();
  Conn& c = conns.emplace_back();
  c.peer = peer_name(fd.get());
  c.fd = std::move(fd);
  c.deadline = now + limits.handshake_timeout;
  c.last_received = now;
  c.nonce = crypto::random_bytes(store_hs::kNonceBytes);
  if (send(c, store_hs::encode_challenge(c.nonce))) flush(c);
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n == 0) {
      close(c);  // orderly close
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close(c);
      return;
    }
    c.last_received = net::Clock::now();
    if (c.phase == Phase::Closing) continue;  // refused: what it still sends is dropped
    const auto got = static_cast<std::size_t>(n);
    // A stranger sends one small frame; a member at most one frame beyond
    // the one being answered; and all of them together at most the budget.
    const std::size_t limit = c.phase == Phase::Stranger ? sp::kFrameHeader + store_hs::kMaxBody
                                                         : 2 * (sp::kFrameHeader + sp::kMaxFrameBody);
    if (c.in.size() + got > limit) return reject(c, "sent more than a frame's worth");
    if (buffered + got > limits.max_buffered)
      return reject(c, "the store's buffers are full (" + std::to_string(limits.max_buffered >> 20) + " MiB)");
    c.in.append(buf, got);
    note_buffered(got);
    process(c);
    if (c.dead) return;
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close(c);
      return;
    }
    c.out.erase(0, static_cast<std::size_t>(n));
    buffered -= static_cast<std::size_t>(n);
  }
  if (c.out.capacity() > (1u << 20)) c.out.shrink_to_fit();
  // A refusal is out: half-close, so the client reads it before the close
  // (closing with unread input would reset the connection and lose it).
  if (c.phase == Phase::Closing) ::shutdown(c.fd.get(), SHUT_WR);
}

void TcpStoreServer::Impl::process(Conn& c) {
  while (!c.dead && !c.waiting && c.phase != Phase::Closing && c.in.size() >= sp::kFrameHeader) {
    const std::size_t max_body = c.phase == Phase::Stranger ? store_hs::kMaxBody : sp::kMaxFrameBody;
    const auto len = sp::frame_length(c.in, max_body);
    if (!len) return reject(c, c.phase == Phase::Stranger ? "not a gradzip store client (bad first frame)"
                                                          : "sent a malformed frame");
    if (c.in.size() < sp::kFrameHeader + *len) {
      c.in.reserve(sp::kFrameHeader + *len);  // the frame's size, not a doubling of it: memory stays as counted
      return;
    }
    const std::string body = c.in.substr(sp::kFrameHeader, *len);
    c.in.erase(0, sp::kFrameHeader + *len);
    buffered -= sp::kFrameHeader + *len;
    if (c.in.empty() && c.in.capacity() > (1u << 20)) c.in.shrink_to_fit();
    if (c.phase == Phase::Stranger)
      handshake(c, body);
    else
      handle(c, body);
  }
}

void TcpStoreServer::Impl::handshake(Conn& c, std::string_view body) {
  const auto hello = store_hs::parse_hello(body);
  if (!hello) return reject(c, "malformed hello");
  std::string why = store_hs::check_hello(*hello, job, world_size, c.nonce);
  if (why.empty() && members[hello->rank] != nullptr)
    why = "rank " + std::to_string(hello->rank) + " is already connected (" + members[hello->rank]->peer +
          "): a rank started twice, or two jobs on one MASTER_ADDR:MASTER_PORT";
  if (!why.empty()) return refuse(c, why);
  c.phase = Phase::Member;
  c.rank = static_cast<int>(hello->rank);
  members[hello->rank] = &c;
  if (send(c, store_hs::encode_welcome(store_hs::server_proof(job, *hello, c.nonce)))) flush(c);
}

void TcpStoreServer::Impl::handle(Conn& c, std::string_view body) {
  const auto q = sp::parse_request(body);
  if (!q) return reject(c, "rank " + std::to_string(c.rank) + " sent a malformed request");
  switch (q->op) {
    case sp::Op::Set: {
      const std::string_view key = q->keys[0], value = q->value;
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
      const auto it = data.find(q->keys[0]);
      if (it == data.end()) return reply(c, sp::Status::Error, "no such key");
      return reply(c, sp::Status::Ok, it->second);
    }
    case sp::Op::Wait: {
      std::vector<std::string> keys(q->keys.begin(), q->keys.end());
      if (missing(keys).empty()) return reply(c, sp::Status::Ok);
      c.waiting = true;
      c.wait_keys = std::move(keys);
      c.wait_deadline = net::Clock::now() + std::chrono::milliseconds(q->timeout_ms);
      return;
    }
    case sp::Op::Add: {
      const std::string_view key = q->keys[0];
      auto it = data.find(key);
      std::int64_t v = 0;
      if (it != data.end()) {
        const auto& s = it->second;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size())
          return reply(c, sp::Status::Error, "value is not a counter");
      } else {
        if (data.size() >= kMaxKeys || stored_bytes + key.size() + 20 > kMaxStoredBytes)
          return reply(c, sp::Status::Error, "store is full");
        it = data.emplace(std::string(key), std::string()).first;
        stored_bytes += key.size();
      }
      v += q->delta;
      stored_bytes -= it->second.size();
      it->second = std::to_string(v);
      stored_bytes += it->second.size();
      std::string payload;
      bytes::Writer(payload).put(v);
      reply(c, sp::Status::Ok, payload);
      wake_waiters();
      return;
    }
    case sp::Op::Erase: {
      for (const std::string_view key : q->keys) {
        const auto it = data.find(key);
        if (it == data.end()) continue;
        stored_bytes -= it->first.size() + it->second.size();
        data.erase(it);
      }
      return reply(c, sp::Status::Ok);
    }
  }
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

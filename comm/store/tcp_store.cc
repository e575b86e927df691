// TcpStore, the client half: one connection, one request at a time.
#include "comm/store/tcp_store.h"

#include "comm/store/store_protocol.h"
#include "common/error.h"

namespace gz {

namespace sp = store_proto;

namespace {

void check_key(const std::string& key) {
  GZ_ENFORCE(!key.empty() && key.size() <= sp::kMaxKey, "store keys are 1..", sp::kMaxKey, " bytes, got ",
             key.size());
}

// Slack on top of a wait's own timeout for the server's answer to arrive.
constexpr Timeout kReplySlack{5000};

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool host_server, Timeout timeout)
    : Store(timeout), host_(host), port_(port) {
  if (host_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port);
    port_ = server_->port();
  }
  GZ_ENFORCE(port_ > 0 && port_ < 65536, "store port must be in 1..65535 (0 only when hosting)");
  conn_ = net::connect_tcp(host_, port_, net::Clock::now() + timeout);
}

TcpStore::~TcpStore() {
  conn_.reset();
  server_.reset();
}

std::shared_ptr<TcpStore> TcpStore::from_env(Timeout timeout) {
  const RankInfo info = rank_info_from_env();
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, info.rank == 0, timeout);
}

std::string TcpStore::request(const std::string& body, net::Deadline deadline) {
  std::lock_guard lock(mu_);
  if (broken_) GZ_THROW(IoError, "store connection to ", host_, ":", port_, " is broken by an earlier failure");
  try {
    const std::string f = sp::frame(body);
    net::write_all(conn_.get(), f.data(), f.size(), deadline);
    char hdr[sp::kFrameHeader];
    net::read_exact(conn_.get(), hdr, sizeof hdr, deadline);
    bytes::Reader r(std::string_view(hdr, sizeof hdr));
    const std::uint32_t magic = r.get<std::uint32_t>(), len = r.get<std::uint32_t>();
    if (magic != sp::kMagic || len == 0 || len > sp::kMaxFrameBody)
      GZ_THROW(IoError, "store at ", host_, ":", port_, " sent a malformed reply (magic ", magic, ", ", len,
               " bytes)");
    std::string reply(len, '\0');
    net::read_exact(conn_.get(), reply.data(), len, deadline);
    return reply;
  } catch (const IoError&) {
    broken_ = true;
    throw;
  }
}

void TcpStore::do_set(const std::string& key, std::string_view value) {
  check_key(key);
  GZ_ENFORCE(value.size() <= sp::kMaxValue, "store values are at most ", sp::kMaxValue, " bytes, got ",
             value.size());
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(sp::Op::Set));
  w.str(key);
  w.str(value);
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store rejected set('", key, "'): ", reply.substr(1));
}

std::string TcpStore::do_get(const std::string& key) {
  check_key(key);
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(sp::Op::Get));
  w.str(key);
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store get('", key, "') failed: ", reply.substr(1));
  return reply.substr(1);
}

void TcpStore::do_wait(const std::vector<std::string>& keys, Timeout timeout) {
  GZ_ENFORCE(keys.size() <= sp::kMaxWaitKeys, "a store wait takes at most ", sp::kMaxWaitKeys, " keys");
  if (keys.empty()) return;
  const auto ms = std::min<Timeout::rep>(timeout.count(), 0x7FFFFFFF);
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(sp::Op::Wait));
  w.put(static_cast<std::uint32_t>(ms < 0 ? 0 : ms));
  w.put(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  const std::string reply = request(body, net::Clock::now() + timeout + kReplySlack);
  const auto status = static_cast<sp::Status>(reply[0]);
  if (status == sp::Status::Ok) return;
  if (status == sp::Status::Timeout) {
    bytes::Reader r(std::string_view(reply).substr(1));
    std::vector<std::string> missing;
    const std::uint32_t count = r.get<std::uint32_t>();
    for (std::uint32_t i = 0; i < count && r.ok() && i < sp::kMaxWaitKeys; ++i) missing.emplace_back(r.str(sp::kMaxKey));
    GZ_THROW(IoError, "store: timed out after ", timeout.count(), " ms waiting for keys: ", join_keys(missing));
  }
  GZ_THROW(IoError, "store wait failed: ", reply.substr(1));
}

std::int64_t TcpStore::do_add(const std::string& key, std::int64_t delta) {
  check_key(key);
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(sp::Op::Add));
  w.str(key);
  w.put(delta);
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store add('", key, "') failed: ", reply.substr(1));
  bytes::Reader r(std::string_view(reply).substr(1));
  const std::int64_t v = r.get<std::int64_t>();
  if (!r.ok()) GZ_THROW(IoError, "store sent a malformed add reply");
  return v;
}

}  // namespace gz

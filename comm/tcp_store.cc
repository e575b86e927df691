// TcpStore, the client half: one connection, one request at a time.
#include "comm/tcp_store.h"

#include "comm/store_protocol.h"
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
    sp::Reader r(std::string_view(hdr, sizeof hdr));
    const std::uint32_t magic = r.u32(), len = r.u32();
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
  sp::put_u8(body, static_cast<std::uint8_t>(sp::Op::Set));
  sp::put_str(body, key);
  sp::put_str(body, value);
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store rejected set('", key, "'): ", reply.substr(1));
}

std::string TcpStore::do_get(const std::string& key) {
  check_key(key);
  std::string body;
  sp::put_u8(body, static_cast<std::uint8_t>(sp::Op::Get));
  sp::put_str(body, key);
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
  sp::put_u8(body, static_cast<std::uint8_t>(sp::Op::Wait));
  sp::put_u32(body, static_cast<std::uint32_t>(ms < 0 ? 0 : ms));
  sp::put_u32(body, static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    sp::put_str(body, k);
  }
  const std::string reply = request(body, net::Clock::now() + timeout + kReplySlack);
  const auto status = static_cast<sp::Status>(reply[0]);
  if (status == sp::Status::Ok) return;
  if (status == sp::Status::Timeout) {
    sp::Reader r(std::string_view(reply).substr(1));
    std::vector<std::string> missing;
    const std::uint32_t count = r.u32();
    for (std::uint32_t i = 0; i < count && r.ok() && i < sp::kMaxWaitKeys; ++i) missing.emplace_back(r.str(sp::kMaxKey));
    GZ_THROW(IoError, "store: timed out after ", timeout.count(), " ms waiting for keys: ", join_keys(missing));
  }
  GZ_THROW(IoError, "store wait failed: ", reply.substr(1));
}

std::int64_t TcpStore::do_add(const std::string& key, std::int64_t delta) {
  check_key(key);
  std::string body;
  sp::put_u8(body, static_cast<std::uint8_t>(sp::Op::Add));
  sp::put_str(body, key);
  sp::put_i64(body, delta);
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store add('", key, "') failed: ", reply.substr(1));
  sp::Reader r(std::string_view(reply).substr(1));
  const std::int64_t v = r.i64();
  if (!r.ok()) GZ_THROW(IoError, "store sent a malformed add reply");
  return v;
}

}  // namespace gz

// TcpStore, the client half: one connection, the handshake, then one request
// at a time.
#include "comm/store/tcp_store.h"

#include <thread>

#include "comm/store/store_handshake.h"
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

// The server answered, but not as the job's server would: not retried.
class NotGenuine : public IoError {
 public:
  using IoError::IoError;
};

// One frame's body (at most max_body bytes), or IoError.
std::string read_frame(int fd, std::size_t max_body, net::Deadline deadline, const std::string& from) {
  char hdr[sp::kFrameHeader];
  net::read_exact(fd, hdr, sizeof hdr, deadline);
  const auto len = sp::frame_length(std::string_view(hdr, sizeof hdr), max_body);
  if (!len) GZ_THROW(NotGenuine, from, " sent a malformed frame (not a gradzip store of this version?)");
  std::string body(*len, '\0');
  net::read_exact(fd, body.data(), *len, deadline);
  return body;
}

}  // namespace

std::string store_hs::client_handshake(int fd, const StoreMember& me, net::Deadline deadline) {
  const std::string from = "the server";
  std::uint32_t version = 0;
  const auto nonce = parse_challenge(read_frame(fd, kMaxBody, deadline, from), &version);
  if (!nonce) GZ_THROW(NotGenuine, "the server's first frame is not a store challenge");
  if (version != kVersion)
    GZ_THROW(NotGenuine, "the server speaks store protocol version ", version, ", this rank ", kVersion,
             " (ranks from different gradzip versions?)");
  const Hello hello = make_hello(me.job, me.rank, me.world_size, *nonce);
  const std::string f = sp::frame(encode_hello(hello));
  net::write_all(fd, f.data(), f.size(), deadline);
  const auto answer = parse_answer(read_frame(fd, kMaxBody, deadline, from));
  if (!answer) GZ_THROW(NotGenuine, "the server's answer to the hello is malformed");
  if (!answer->admitted) return answer->reason.empty() ? "(no reason given)" : answer->reason;
  if (!server_proof_ok(me.job, hello, *nonce, answer->proof))
    GZ_THROW(NotGenuine, "the server could not prove it knows the job token: another program holds the port, "
                         "or rank 0 has another GRADZIP_JOB_TOKEN");
  return {};
}

TcpStore::TcpStore(const std::string& host, int port, bool host_server, StoreMember me, Timeout timeout)
    : Store(timeout), host_(host), port_(port), me_(std::move(me)) {
  GZ_ENFORCE(me_.world_size >= 1 && me_.rank >= 0 && me_.rank < me_.world_size, "rank ", me_.rank,
             " is not in [0, ", me_.world_size, ")");
  if (host_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port, me_.job, me_.world_size);
    port_ = server_->port();
  }
  GZ_ENFORCE(port_ > 0 && port_ < 65536, "store port must be in 1..65535 (0 only when hosting)");
  const auto deadline = net::Clock::now() + timeout;
  for (;;) {
    conn_ = net::connect_tcp(host_, port_, deadline);
    std::string refusal;
    try {
      refusal = store_hs::client_handshake(conn_.get(), me_, deadline);
    } catch (const NotGenuine& e) {
      GZ_THROW(IoError, "rank ", me_.rank, ": the store at ", where(), " failed the handshake: ", e.what());
    } catch (const IoError& e) {
      // Closed before the end of the handshake: a server busy with strangers
      // may have evicted this connection. Connect again until the deadline.
      if (net::Clock::now() + std::chrono::milliseconds(50) >= deadline)
        GZ_THROW(IoError, "rank ", me_.rank, ": no handshake with the store at ", where(), " within ",
                 timeout.count(), " ms: ", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (!refusal.empty())
      GZ_THROW(IoError, "rank ", me_.rank, " of ", me_.job.describe(), ": the store at ", where(),
               " refused it: ", refusal);
    return;
  }
}

TcpStore::~TcpStore() {
  conn_.reset();
  server_.reset();
}

std::string TcpStore::where() const { return host_ + ":" + std::to_string(port_); }

std::shared_ptr<TcpStore> TcpStore::from_env(Timeout timeout) {
  const RankInfo info = rank_info_from_env();
  StoreMember me{job_identity_from_env(), info.rank, info.world_size};
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, info.rank == 0, std::move(me), timeout);
}

std::string TcpStore::request(const std::string& body, net::Deadline deadline) {
  std::lock_guard lock(mu_);
  if (broken_) GZ_THROW(IoError, "store connection to ", where(), " is broken by an earlier failure");
  try {
    const std::string f = sp::frame(body);
    net::write_all(conn_.get(), f.data(), f.size(), deadline);
    return read_frame(conn_.get(), sp::kMaxFrameBody, deadline, "store at " + where());
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
  if (!r.ok() || !r.at_end()) GZ_THROW(IoError, "store sent a malformed add reply");
  return v;
}

void TcpStore::do_erase(const std::vector<std::string>& keys) {
  GZ_ENFORCE(keys.size() <= sp::kMaxWaitKeys, "a store erase takes at most ", sp::kMaxWaitKeys, " keys");
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(sp::Op::Erase));
  w.put(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  const std::string reply = request(body, net::Clock::now() + timeout());
  if (static_cast<sp::Status>(reply[0]) != sp::Status::Ok)
    GZ_THROW(IoError, "store erase(", join_keys(keys), ") failed: ", reply.substr(1));
}

}  // namespace gz

// Stores: HashStore, PrefixStore and SealedStore semantics; TcpStore over
// loopback, and a TcpStore server that meets garbage and oversized frames
// from a member. (Strangers, floods and fake servers: store_adversary_test.cc.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "comm/store/hash_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/sealed_store.h"
#include "comm/store/socket.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"
#include "tests/comm/store_test_util.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using namespace gz::test;

// The same contract for every Store.
void check_store_contract(Store& a, Store& b) {
  a.set("k1", std::string("v\0x", 3));
  EXPECT_EQ(b.get("k1"), std::string("v\0x", 3));
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    a.set("late", "here");
  });
  b.wait({"k1", "late"}, Timeout(5000));  // wakes when the key arrives
  setter.join();
  EXPECT_EQ(b.get("late"), "here");
  EXPECT_EQ(a.add("ctr", 5), 5);
  EXPECT_EQ(b.add("ctr", -2), 3);
  a.set("gone1", "x");
  a.set("gone2", "y");
  b.erase({"gone1", "gone2", "never-there"});
  EXPECT_THROW(b.wait({"gone1"}, Timeout(50)), IoError);
  EXPECT_THROW(b.wait({"gone2"}, Timeout(50)), IoError);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    b.wait({"k1", "never1", "never2"}, Timeout(200));
    ADD_FAILURE() << "wait should time out";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("never1, "), std::string::npos) << m;
    EXPECT_NE(m.find("never2"), std::string::npos) << m;
    EXPECT_EQ(m.find("k1"), std::string::npos) << "only missing keys are listed: " << m;
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 3s);
}

TEST(HashStore, Contract) {
  HashStore s;
  check_store_contract(s, s);
}

TEST(PrefixStore, SeparatesNamespaces) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base), b("b", base), a2("a", base);
  check_store_contract(a, a2);
  a.set("x", "1");
  b.set("x", "2");
  EXPECT_EQ(a.get("x"), "1");
  EXPECT_EQ(b.get("x"), "2");
  EXPECT_EQ(base->get("a/x"), "1");
}

TEST(SealedStore, ContractAndTagsBoundToKeyAndJob) {
  auto base = std::make_shared<HashStore>();
  SealedStore a(base, "job-key-A"), a2(base, "job-key-A"), b(base, "job-key-B");
  check_store_contract(a, a2);
  a.set("k", "v");
  EXPECT_EQ(a2.get("k"), "v");
  EXPECT_NE(base->get("k"), "v");  // sealed underneath
  // Another job's key, a value copied to another key, a plain value, a flipped bit: refused.
  EXPECT_THROW(b.get("k"), IoError);
  base->set("copy", base->get("k"));
  EXPECT_THROW(a.get("copy"), IoError);
  base->set("plain", "v");
  EXPECT_THROW(a.get("plain"), IoError);
  std::string flipped = base->get("k");
  flipped[9] ^= 1;
  base->set("flipped", flipped);
  EXPECT_THROW(a.get("flipped"), IoError);
  try {
    a.get("plain");
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'plain'"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ContractOverLoopback) {
  TcpStore server("127.0.0.1", 0, true, member(0, 2), Timeout(5000));
  TcpStore client("127.0.0.1", server.port(), false, member(1, 2), Timeout(5000));
  check_store_contract(server, client);
}

TEST(TcpStore, ManyClientsRendezvous) {
  const int P = 8;
  TcpStore host("127.0.0.1", 0, true, member(P, P + 1), Timeout(5000));
  std::vector<std::thread> ts;
  std::vector<std::string> seen(P);
  for (int r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      TcpStore c("127.0.0.1", host.port(), false, member(r, P + 1), Timeout(5000));
      c.set("addr/" + std::to_string(r), std::string(300, static_cast<char>('a' + r)));
      for (int q = 0; q < P; ++q) seen[r] += c.get("addr/" + std::to_string(q)).substr(0, 1);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < P; ++r) EXPECT_EQ(seen[r], "abcdefgh");
}

TEST(TcpStore, ClientRejectsOversizedValuesAndKeys) {
  TcpStore s("127.0.0.1", 0, true, member(0, 1), Timeout(5000));
  EXPECT_THROW(s.set("big", std::string(store_proto::kMaxValue + 1, 'x')), InvalidArgument);
  EXPECT_THROW(s.set(std::string(store_proto::kMaxKey + 1, 'k'), "v"), InvalidArgument);
  s.set("ok", "still works");
  EXPECT_EQ(s.get("ok"), "still works");
}

// A member (it passed the handshake) that sends garbage is disconnected; the
// other members are served on.
TEST(TcpStoreServer, DisconnectsAMembersGarbageAndOversizedFramesAndKeepsServing) {
  const int P = 7;
  TcpStoreServer server("127.0.0.1", 0, member(0, P).job, P);
  TcpStore good("127.0.0.1", server.port(), false, member(0, P), Timeout(5000));
  good.set("before", "1");
  int next_rank = 1;
  auto after_handshake = [&](const std::string& bytes) {
    net::Fd fd = raw_member(server.port(), member(next_rank++, P));
    send_raw(fd.get(), bytes);
    return closed_by_peer(fd.get());
  };

  std::string huge;  // a valid magic, then a length far over the limit
  bytes::Writer huge_w(huge);
  huge_w.put(store_proto::kMagic);
  huge_w.put<std::uint32_t>(0xFFFFFFF0u);
  EXPECT_TRUE(after_handshake(huge));
  EXPECT_TRUE(after_handshake("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string bad_op;  // well framed, unknown op
  bytes::Writer(bad_op).put<std::uint8_t>(99);
  EXPECT_TRUE(after_handshake(store_proto::frame(bad_op)));
  std::string lying_key;  // a key length past the end of the frame
  bytes::Writer lying_key_w(lying_key);
  lying_key_w.put(static_cast<std::uint8_t>(store_proto::Op::Set));
  lying_key_w.put<std::uint32_t>(1000000);
  lying_key += "abc";
  EXPECT_TRUE(after_handshake(store_proto::frame(lying_key)));
  std::string many_keys;  // a wait on more keys than allowed
  bytes::Writer many_keys_w(many_keys);
  many_keys_w.put(static_cast<std::uint8_t>(store_proto::Op::Wait));
  many_keys_w.put<std::uint32_t>(10);
  many_keys_w.put<std::uint32_t>(1u << 30);
  EXPECT_TRUE(after_handshake(store_proto::frame(many_keys)));
  std::string zero;  // a zero-length frame
  bytes::Writer zero_w(zero);
  zero_w.put(store_proto::kMagic);
  zero_w.put<std::uint32_t>(0);
  EXPECT_TRUE(after_handshake(zero));
  EXPECT_EQ(server.rejected(), 6u);

  // The well-behaved client was never disturbed.
  good.set("after", "2");
  EXPECT_EQ(good.get("before"), "1");
  EXPECT_EQ(good.get("after"), "2");
}

TEST(TcpStore, ClientFailsClearlyWhenTheServerIsGone) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, member(0, 1).job, 1);
  TcpStore c("127.0.0.1", server->port(), false, member(0, 1), Timeout(2000));
  c.set("x", "1");
  server.reset();
  try {
    c.get("x");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("store"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ConnectTimesOutWithoutAServer) {
  const int port = [] {  // a port nobody listens on
    net::Fd l = net::listen_tcp("127.0.0.1", 0);
    return net::bound_port(l.get());
  }();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(TcpStore("127.0.0.1", port, false, member(1, 2), Timeout(300)), IoError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

}  // namespace
}  // namespace gz

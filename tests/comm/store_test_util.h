// Helpers for the Store tests: members of a test job, and raw sockets that
// play strangers, buggy members and fake servers.
#pragma once

#include <string>

#include "comm/security/job_identity.h"
#include "comm/store/socket.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"

namespace gz::test {

inline constexpr char kTestToken[] = "0123456789abcdef-test-job";

inline StoreMember member(int rank, int world, const std::string& token = kTestToken) {
  return StoreMember{job_identity_from_token(token), rank, world};
}

inline net::Fd raw_connect(int port) { return net::connect_tcp("127.0.0.1", port, net::Clock::now() + std::chrono::seconds(5)); }

/// A raw connection that passed the handshake as `me` (then anything can be sent on it).
inline net::Fd raw_member(int port, const StoreMember& me) {
  net::Fd fd = raw_connect(port);
  const std::string refusal = store_hs::client_handshake(fd.get(), me, net::Clock::now() + std::chrono::seconds(5));
  if (!refusal.empty()) GZ_THROW(IoError, "refused: ", refusal);
  return fd;
}

inline void send_raw(int fd, const std::string& bytes) {
  net::write_all(fd, bytes.data(), bytes.size(), net::Clock::now() + std::chrono::seconds(5));
}

/// Reads until the peer closes or resets the connection (true) or 5 s pass
/// without that (false); what arrived is appended to `got`.
inline bool closed_by_peer(int fd, std::string* got = nullptr) {
  char c[4096];
  const auto deadline = net::Clock::now() + std::chrono::seconds(5);
  try {
    for (;;) {
      if (net::Clock::now() >= deadline) return false;
      net::read_exact(fd, c, 1, deadline);
      if (got) got->push_back(c[0]);
    }
  } catch (const IoError& e) {
    return std::string(e.what()).find("timed out") == std::string::npos;
  }
}

/// A request frame (the client's encoding, for raw sockets).
inline std::string set_frame(const std::string& key, const std::string& value) {
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(store_proto::Op::Set));
  w.str(key);
  w.str(value);
  return store_proto::frame(body);
}
inline std::string get_frame(const std::string& key) {
  std::string body;
  bytes::Writer w(body);
  w.put(static_cast<std::uint8_t>(store_proto::Op::Get));
  w.str(key);
  return store_proto::frame(body);
}

}  // namespace gz::test

// TcpStore: the Store every rank of a job shares. Rank 0 hosts the server (a
// background thread in its process); every rank, rank 0 included, is a
// client. Configured torchrun-style: from_env() reads MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, and GRADZIP_JOB_TOKEN (comm/security/job_identity.h).
//
// What it trusts: the job's token. A connection is served only after the
// handshake (store_handshake.h) proves, both ways, that each end knows the
// token and belongs to the same job (id and world size), one connection per
// rank; anything else is refused and logged, and a rank of another job on the
// same port gets an IoError naming the clash. Members are trusted to follow
// the protocol; strangers cannot read, write or exhaust the server (its
// bounds: tcp_store_server.cc). It is a rendezvous for one job on a trusted
// network: the traffic is authenticated at the start, not encrypted, so an
// attacker on the path can read values and hijack a connection; without a
// token, anyone who can reach the port can join (a warning says so).
//
// The server answers waits itself (it holds a waiter until its keys exist or
// its timeout passes), so a wait costs one round trip.
#pragma once

#include <memory>
#include <mutex>

#include "comm/security/job_identity.h"
#include "comm/store/socket.h"
#include "comm/store/store.h"

namespace gz {

class TcpStoreServer;

/// Who connects: the job and this rank's place in it.
struct StoreMember {
  JobIdentity job;
  int rank = 0;
  int world_size = 1;
};

class TcpStore final : public Store {
 public:
  /// @param[in] host, port  the server's address (port 0 with host_server: any free port)
  /// @param[in] host_server start the server in this process (rank 0)
  /// @param[in] me          the job and this rank (checked by the server's handshake)
  /// @param[in] timeout     default wait timeout, also the connect-and-handshake deadline
  TcpStore(const std::string& host, int port, bool host_server, StoreMember me, Timeout timeout = default_timeout());
  ~TcpStore() override;

  /// From MASTER_ADDR/MASTER_PORT, RANK/WORLD_SIZE and GRADZIP_JOB_TOKEN; RANK 0 hosts the server.
  static std::shared_ptr<TcpStore> from_env(Timeout timeout = default_timeout());

  /// The server's port (useful with port 0).
  int port() const { return port_; }
  const StoreMember& member() const { return me_; }

 protected:
  void do_set(const std::string& key, std::string_view value) override;
  std::string do_get(const std::string& key) override;
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  void do_erase(const std::vector<std::string>& keys) override;

 private:
  // Sends one request and reads its reply body (status byte first).
  std::string request(const std::string& body, net::Deadline deadline);
  std::string where() const;

  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  int port_ = 0;
  StoreMember me_;
  std::mutex mu_;  // one request at a time on the connection
  net::Fd conn_;
  bool broken_ = false;  // a request failed half-way: the stream is out of step
};

/// The server's bounds (docs/comm.md, "TcpStore defences"); tests shorten them.
struct TcpStoreLimits {
  std::size_t max_strangers = 64;     ///< connections not through the handshake yet (the oldest is evicted)
  Timeout handshake_timeout{10000};   ///< for a stranger to complete the handshake
  Timeout stall_timeout{30000};       ///< for a member to finish a frame it began
  std::size_t max_buffered = 32u << 20;  ///< bytes in flight over all connections (frames in, replies out)
};

/// The server half, usable on its own (tests start one on port 0).
class TcpStoreServer {
 public:
  /// Listens on host:port and serves `job`'s `world_size` ranks from a
  /// background thread until destroyed. Throws IoError naming the address
  /// when it cannot listen (e.g. another job's store holds the port).
  TcpStoreServer(const std::string& host, int port, JobIdentity job, int world_size, TcpStoreLimits limits = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  /// Connections refused or closed for protocol violations so far (for tests).
  std::size_t rejected() const;
  /// The most bytes buffered at once across all connections (for tests).
  std::size_t buffered_peak() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

namespace store_hs {
/// The client's half of the handshake on a connected socket: returns "" when
/// the server admitted this rank, else the server's reason for refusing it.
/// Throws IoError when the connection fails or the server cannot prove it
/// belongs to the job. (Tests drive it on raw sockets.)
std::string client_handshake(int fd, const StoreMember& me, net::Deadline deadline);
}  // namespace store_hs

}  // namespace gz

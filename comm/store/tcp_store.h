// TcpStore: the Store every rank of a job shares. Rank 0 hosts the server (a
// background thread in its process); every rank, rank 0 included, is a
// client. Configured torchrun-style: from_env() reads MASTER_ADDR,
// MASTER_PORT, RANK and WORLD_SIZE.
//
// The server answers waits itself (it holds a waiter until its keys exist or
// its timeout passes), so a wait costs one round trip. Frames are
// length-checked and bounded (comm/store_protocol.h): a client that sends an
// oversized or garbage frame is disconnected; the others are served on.
#pragma once

#include <memory>
#include <mutex>

#include "comm/store/socket.h"
#include "comm/store/store.h"

namespace gz {

class TcpStoreServer;

class TcpStore final : public Store {
 public:
  /// @param[in] host, port  the server's address (port 0 with host_server: any free port)
  /// @param[in] host_server start the server in this process (rank 0)
  /// @param[in] timeout     default wait timeout, also the connect deadline
  TcpStore(const std::string& host, int port, bool host_server, Timeout timeout = default_timeout());
  ~TcpStore() override;

  /// From MASTER_ADDR/MASTER_PORT; RANK 0 hosts the server.
  static std::shared_ptr<TcpStore> from_env(Timeout timeout = default_timeout());

  /// The server's port (useful with port 0).
  int port() const { return port_; }

 protected:
  void do_set(const std::string& key, std::string_view value) override;
  std::string do_get(const std::string& key) override;
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;

 private:
  // Sends one request and reads its reply body (status byte first).
  std::string request(const std::string& body, net::Deadline deadline);

  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  int port_ = 0;
  std::mutex mu_;  // one request at a time on the connection
  net::Fd conn_;
  bool broken_ = false;  // a request failed half-way: the stream is out of step
};

/// The server half, usable on its own (tests start one on port 0).
class TcpStoreServer {
 public:
  /// Listens on host:port and serves from a background thread until destroyed.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  /// Connections closed for protocol violations so far (for tests).
  std::size_t rejected() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace gz

// UcxTransport: byte collectives over UCP tag send/recv, between every pair
// of ranks.
//
// Setup: one UCP context and worker per rank; the worker addresses are
// exchanged through the Store ("ucx/addr/<rank>") and an endpoint is made to
// every peer, in UCP_ERR_HANDLING_MODE_PEER with an error handler, so that a
// peer that dies surfaces as an error on its endpoint rather than a silence.
// UCX_TLS, UCX_NET_DEVICES and the other UCX_* variables are honoured (the
// emulated cluster runs with UCX_TLS=tcp between network namespaces; the
// addresses exchanged are each worker's own).
//
// Messages. Each collective call takes the next sequence number (the same on
// every rank, since calls are made in the same order); a message's tag is
// (sequence << 32) | (source rank << 8) | collective, received with a full
// mask, so messages of different calls or senders never match each other.
//
// Waiting. One helper (wait_all) progresses the worker until every request
// of the call is done, a request fails, a peer's endpoint reports an error,
// or the deadline passes; then it throws IoError naming the ranks it was
// waiting for. It sleeps on the worker's event fd between progress rounds
// (UCP_FEATURE_WAKEUP), so waiting ranks leave the CPU to working ones;
// GRADZIP_UCX_BUSY_POLL=1 spins instead.
//
// Failure. On any error the transport cancels its receives, force-closes
// every endpoint (so peers notice at once rather than at their timeout) and
// is broken from then on.
//
// CUDA buffers are staged through pinned host memory (Debian's UCX has no
// CUDA support); see transport.h.
#pragma once

#include <memory>
#include <vector>

#include "comm/store/store.h"
#include "comm/transport.h"

namespace gz {

class UcxTransport final : public Transport {
 public:
  /// Creates the worker and connects to every rank. Collective: every rank of
  /// the group must call it with the same store (prefix) and size.
  /// @param[in] store    shared by the group
  /// @param[in] rank     0 <= rank < size
  /// @param[in] timeout  for the address exchange
  UcxTransport(Store& store, int rank, int size, Timeout timeout = default_timeout());
  ~UcxTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }

  void allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                  const CallContext& ctx) override;
  void alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv, std::span<std::size_t> received,
                 const CallContext& ctx) override;
  void barrier(const CallContext& ctx) override;

  bool exact_sizes() const override { return true; }
  bool device_memory() const override { return false; }
  std::size_t staging_bytes() const override;

  /// The UCX transports in use, as UCX reports them (for bench headers).
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_, size_;
};

}  // namespace gz

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
// Messages. Each rank counts the messages it posted to and from every peer;
// a message's tag is (that count << 32) | (source rank << 8), received with a
// full mask, so between two ranks the k-th send matches the k-th receive
// (transport.h's rule) and messages of other exchanges or senders never
// match each other. Sends go out with ucp_tag_send_nbx as soon as they are
// posted: the kernel's socket buffers move their bytes while the caller
// computes (UCX_TLS=tcp), and test()/wait() progress the worker.
//
// Waiting. wait() progresses the worker until every request of the exchange
// is done, a request fails, a peer's endpoint reports an error, or the
// exchange's deadline passes; then it throws IoError naming the ranks it was
// waiting for. It sleeps on the worker's event fd between progress rounds
// (UCP_FEATURE_WAKEUP), so waiting ranks leave the CPU to working ones;
// GRADZIP_UCX_BUSY_POLL=1 spins instead. test() progresses once and looks.
//
// Failure. On any error (or abort()) the transport cancels the receives of
// every exchange in flight, force-closes every endpoint (so peers notice at
// once rather than at their timeout) and is broken from then on.
//
// CUDA buffers are staged through pinned host memory (Debian's UCX has no
// CUDA support); see transport.h.
#pragma once

#include <memory>
#include <vector>

#include "comm/store/store.h"
#include "comm/transports/transport.h"

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

  Exchange start(std::span<const SendOp> sends, std::span<const RecvOp> recvs, const CallContext& ctx) override;
  bool test(Exchange x) override;
  void wait(Exchange x) override;
  void abort(std::string_view why) override;

  /// Host buffers as exchanges; CUDA buffers staged through pinned memory.
  void allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                  const CallContext& ctx) override;
  void alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv, std::span<std::size_t> received,
                 const CallContext& ctx) override;

  bool exact_sizes() const override { return true; }
  bool device_memory() const override { return false; }
  std::size_t staging_bytes() const override;

  /// The UCX transports in use, as UCX reports them (for bench headers).
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_, size_;
};

}  // namespace gz

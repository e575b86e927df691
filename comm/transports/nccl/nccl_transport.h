// NcclTransport: byte collectives as grouped ncclSend/ncclRecv between every
// pair, on the caller's CUDA stream. NCCL needs one GPU per rank.
//
// Setup: rank 0 makes the unique id, the others read it from the Store
// ("nccl/id"); the communicator is non-blocking (config.blocking = 0) so that
// every wait, init included, polls with a deadline and ncclCommAbort ends a
// wait that passed it (a dead peer never hangs the caller).
//
// Exchanges are a ncclGroup of ncclSend/ncclRecv on the transport's own
// communication stream, after an event on the caller's stream (the work
// queued before start()), ending with an event that wait() makes the
// caller's stream wait for: the caller's kernels (the encode of the next
// segment) overlap the transfers, and nothing blocks the host; synchronize(ctx)
// waits, polling ncclCommGetAsyncError against the deadline. Buffers must be
// device memory. NCCL needs the receiver to know the byte count, so
// exact_sizes() is false: senders send exactly what the receive posts.
#pragma once

#include <memory>

#include "comm/store/store.h"
#include "comm/transports/transport.h"

typedef struct ncclComm* ncclComm_t;

namespace gz {

class NcclTransport final : public Transport {
 public:
  /// Collective over `size` ranks. Selects `cuda_device` for this thread.
  NcclTransport(Store& store, int rank, int size, int cuda_device, Timeout timeout = default_timeout());
  ~NcclTransport() override;

  /// GPUs this process sees (0 when CUDA reports none or fails).
  static int device_count();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  Exchange start(std::span<const SendOp> sends, std::span<const RecvOp> recvs, const CallContext& ctx) override;
  bool test(Exchange x) override;
  void wait(Exchange x) override;
  void abort(std::string_view why) override;
  void barrier(const CallContext& ctx) override;
  void synchronize(const CallContext& ctx) override;

  bool exact_sizes() const override { return false; }
  bool device_memory() const override { return true; }

  /// The communicator, for the benchmark's ncclAllReduce baseline.
  ncclComm_t comm() const;
  /// Sum-allreduce of n floats in place with ncclAllReduce (bench baseline), then synchronize.
  const char* native_allreduce() const override { return "ncclAllReduce"; }
  void native_allreduce_sum(float* buffer, std::size_t n, const CallContext& ctx) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_, size_;
};

}  // namespace gz

// Transport: byte collectives between the ranks of one group. It moves bytes
// and knows nothing of codecs or payload formats.
//
//   allgatherv  every rank sends one buffer; rank i's lands in slot i everywhere
//   alltoallv   rank r sends buffer j to rank j; rank j's slot r receives it
//   barrier     nobody leaves before everybody arrived
//
// Every call takes a CallContext: where the buffers live (host or CUDA), the
// CUDA stream that orders device buffers, and the timeout. A peer that dies or
// stays silent makes the call throw IoError within the timeout; after an
// IoError the transport is broken (every later call throws): rebuild it.
//
// Sizes. The sender's byte count may be smaller than the receiving slot
// (variable-size payloads). Transports whose exact_sizes() is true (UCX) report
// the bytes each slot received; others (NCCL) need the sender to send exactly
// the slot's capacity and report that.
//
// Device memory. A transport whose device_memory() is false (UCX from Debian:
// no CUDA support) stages CUDA buffers through pinned host memory it owns
// (staging_bytes() reports it; grown once, reused). NCCL takes device buffers
// on the caller's stream and returns before the data has moved:
// synchronize() waits for the stream, with the timeout.
//
// Calls on one transport must be made in the same order on every rank, one
// at a time (not thread-safe).
#pragma once

#include <cstddef>
#include <span>

#include "comm/env.h"
#include "common/stream.h"

namespace gz {

/// Where a call's buffers live and how long it may wait.
struct CallContext {
  Device device = Device::Cpu;
  Stream stream = nullptr;  ///< CUDA stream ordering device buffers (Device::Cuda)
  Timeout timeout = default_timeout();
};

/// A buffer to send.
struct ConstSlice {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// A buffer to receive into: `bytes` is its capacity.
struct Slice {
  void* data = nullptr;
  std::size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport();
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "ucx", "nccl", ...
  virtual const char* name() const = 0;

  /// Sends `send` to every rank; recv[i] receives rank i's buffer (recv[rank()]
  /// gets a copy of send unless it is the same memory).
  /// @param[in]  send      this rank's bytes (at most recv[i].bytes on every rank)
  /// @param[out] recv      size() slots
  /// @param[out] received  size() counts: bytes that landed in each slot
  virtual void allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                          const CallContext& ctx) = 0;

  /// send[j] goes to rank j; recv[i] receives rank i's send[rank()].
  /// send[rank()] is copied to recv[rank()] unless it is the same memory.
  virtual void alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv,
                         std::span<std::size_t> received, const CallContext& ctx) = 0;

  /// Returns once every rank has entered the barrier.
  virtual void barrier(const CallContext& ctx) = 0;

  /// Waits until the calls queued on ctx.stream are done (NCCL); a no-op for
  /// transports whose calls return complete (UCX).
  virtual void synchronize(const CallContext& ctx);

  /// True when the counts reported in `received` are the bytes sent (else
  /// the slot capacity, and the sender must send exactly that).
  virtual bool exact_sizes() const = 0;
  /// True when CUDA buffers are used in place (no staging).
  virtual bool device_memory() const = 0;
  /// Pinned host bytes held for staging CUDA buffers (0 if none).
  virtual std::size_t staging_bytes() const { return 0; }
};

}  // namespace gz

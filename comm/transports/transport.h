// Transport: moves bytes between the ranks of one group. It knows nothing of
// codecs or payload formats.
//
// The primitive is the *exchange*: a batch of point-to-point sends and
// receives, posted together, that completes as a whole, without blocking the
// caller in between (gloo's ring() keeps two of them in flight the same way):
//
//   Transport::Exchange x = t.start(sends, recvs, ctx);   // returns at once
//   ...                                                    // encode the next segment
//   t.wait(x);                                             // or poll: t.test(x)
//
// Words: a *message* is one send matched with one receive; an *exchange* is
// the messages one start() posts. The collectives built on it:
//
//   allgatherv  every rank sends one buffer; rank i's lands in slot i everywhere
//   alltoallv   rank r sends buffer j to rank j; rank j's slot r receives it
//   barrier     nobody leaves before everybody arrived
//
// Matching. Between two ranks, messages match in the order they were posted,
// each direction on its own: the k-th message rank a posts to rank b lands in
// the k-th receive rank b posts from rank a. So every rank posts its
// exchanges in the same order (the algorithms of comm/ do), and a receive is
// at least as large as what its sender sends. Exchanges in flight at the same
// time are independent: they may complete in any order.
//
// Every start() takes a CallContext: where the buffers live (host or CUDA),
// the CUDA stream that orders device buffers, and the timeout, counted from
// start(). A peer that dies or stays silent makes wait()/test() throw IoError
// within the timeout. After an IoError, or abort(), the transport is broken:
// every later call throws IoError (rebuild it). Exchanges still in flight
// when it breaks are cancelled: nothing is written into their buffers after
// the throw.
//
// Sizes. A transport whose exact_sizes() is true (UCX) reports the bytes each
// receive got; others (NCCL) report the receive's size, and senders must then
// send exactly what the receiver posted.
//
// Device memory. A transport whose device_memory() is true (NCCL) takes CUDA
// buffers: start() orders the exchange after the work queued on ctx.stream so
// far, and wait() orders ctx.stream after the exchange and returns, possibly
// before the bytes moved (synchronize() waits, with the timeout). One whose
// device_memory() is false (UCX from Debian: no CUDA support) takes host
// memory only in exchanges; its allgatherv/alltoallv stage CUDA buffers
// through pinned host memory they own (staging_bytes() reports it). A caller
// that pipelines CUDA work over it places its buffers in pinned host memory,
// which kernels read and write directly.
//
// A transport over torch.distributed's process group (gloo or NCCL, driven
// from Python) fits the same three calls: start() = batch_isend_irecv of the
// exchange's P2POps (both backends match point-to-point messages per pair in
// posting order, the contract above), test() = every work's is_completed(),
// wait() = every work's wait() with the remaining timeout; exact_sizes() is
// false (a receive learns only its own size); device_memory() is true for
// NCCL (its works order the current stream), false for gloo; abort() =
// the process group's abort, where the backend has one. Each call should
// take the GIL only for its own duration, never across a wait.
//
// Calls on one transport are made by one thread at a time (not thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "comm/base/env.h"
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

/// One message of an exchange, to a peer.
struct SendOp {
  int peer = 0;
  ConstSlice data;
};

/// One message of an exchange, from a peer. *received is set to the bytes
/// that arrived (exact_sizes()) or to data.bytes when the exchange completes.
struct RecvOp {
  int peer = 0;
  Slice data;
  std::size_t* received = nullptr;
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

  /// A started exchange: valid until wait() returns or test() returns true.
  struct Exchange {
    std::uint64_t id = 0;
  };

  /// Posts the sends and receives of one exchange and returns without waiting.
  /// The buffers must stay valid and unchanged (sends) or untouched (receives)
  /// until the exchange completes. Peers are other ranks (never rank()).
  virtual Exchange start(std::span<const SendOp> sends, std::span<const RecvOp> recvs, const CallContext& ctx) = 0;
  /// Makes progress without blocking; true once the exchange is complete (and
  /// then the exchange is finished: do not wait on it).
  virtual bool test(Exchange x) = 0;
  /// Returns once the exchange is complete (device memory: once ctx.stream of
  /// its start() is ordered after it). Throws IoError at its deadline.
  virtual void wait(Exchange x) = 0;
  /// Cancels every exchange in flight and breaks the transport, so that peers
  /// see an error rather than wait for messages that will never come. For a
  /// caller that gives up mid-collective (e.g. on a malformed payload).
  virtual void abort(std::string_view why) = 0;

  /// Sends `send` to every rank; recv[i] receives rank i's buffer (recv[rank()]
  /// gets a copy of send unless it is the same memory).
  /// @param[in]  send      this rank's bytes (at most recv[i].bytes on every rank)
  /// @param[out] recv      size() slots
  /// @param[out] received  size() counts: bytes that landed in each slot
  virtual void allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                          const CallContext& ctx);

  /// send[j] goes to rank j; recv[i] receives rank i's send[rank()].
  /// send[rank()] is copied to recv[rank()] unless it is the same memory.
  virtual void alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv,
                         std::span<std::size_t> received, const CallContext& ctx);

  /// Returns once every rank has entered the barrier.
  virtual void barrier(const CallContext& ctx);

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

  /// What the transport runs on, for benchmark headers (default: name()).
  virtual std::string describe() const;
  /// The name of the library's own dense allreduce, which the benchmark runs
  /// as a baseline row ("ncclAllReduce"), or nullptr when it has none.
  virtual const char* native_allreduce() const { return nullptr; }
  /// That allreduce: n floats summed in place over the ranks, then
  /// synchronized. Throws InvalidArgument when native_allreduce() is nullptr.
  virtual void native_allreduce_sum(float* buffer, std::size_t n, const CallContext& ctx);

 protected:
  /// The exchange with every peer that allgatherv and alltoallv are:
  /// send_to(r) goes to rank r, recv[r] comes from it, and this rank's own
  /// slot is copied locally (device memory on ctx.stream).
  void exchange_with_all(std::span<const ConstSlice> send_to, std::span<const Slice> recv,
                         std::span<std::size_t> received, const CallContext& ctx);
};

}  // namespace gz

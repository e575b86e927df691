// Compressed allreduce: every rank hands in a float buffer and gets back the
// sum (or average) over all ranks, with the bytes on the wire compressed by
// a Codec with error feedback. Options struct + free function, as in gloo.
//
//   gz::AllreduceWorkspace ws;          // one per transport, shared by all states
//   gz::AllreduceState state;           // one per gradient buffer (EF residuals)
//   gz::AllreduceOptions o;
//   o.transport = &transport; o.store = &store; o.workspace = &ws;
//   o.codec = codec.get(); o.state = &state;
//   o.buffer = grad; o.n = n; o.op = gz::ReduceOp::Average;
//   gz::allreduce(o);                   // grad now holds the average, on every rank
//
// Constraints:
//   - Collective: every rank calls with the same codec spec, n, algorithm and
//     op, and the calls on one transport come in the same order on every rank.
//     The first call on a state (and any call whose signature differs from the
//     last one agreed) checks this through the Store; a mismatch throws
//     InvalidArgument on every rank, naming the ranks and values that differ.
//   - Deterministic: every rank ends with bit-identical results (all decode the
//     same payloads in the same rank order).
//   - In place: `buffer` is read, then overwritten with the result.
//   - Memory: buffers are allocated on the first call (or when a larger call
//     comes) and reused; see AllreduceWorkspace::bytes().
//   - Device::Cuda: buffer, EF state and workspace are device memory; work is
//     queued on `stream` and the call returns when the result is complete.
//   - Errors: InvalidArgument (bad input, mismatched ranks, mismatched state),
//     PayloadError (a peer sent a malformed payload), IoError (a peer died or
//     timed out: rebuild the transport).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/memory.h"
#include "comm/store/store.h"
#include "comm/transport.h"
#include "compressors/codec.h"

namespace gz {

enum class ReduceOp : std::uint8_t { Sum = 0, Average = 1 };

/// Allgather: every rank's whole payload to every rank. ScatterReduce:
/// compressed reduce-scatter, then a compressed allgather of the chunk sums.
/// Auto: see resolve_algorithm().
enum class Algorithm : std::uint8_t { Auto = 0, Allgather = 1, ScatterReduce = 2 };

const char* to_string(ReduceOp op);
const char* to_string(Algorithm a);
/// "sum" | "avg"/"average"; throws InvalidArgument listing the choices.
ReduceOp parse_reduce_op(std::string_view s);
/// "auto" | "allgather" | "scatter_reduce"; throws InvalidArgument.
Algorithm parse_algorithm(std::string_view s);

/// What Auto runs for `codec` on `ranks` ranks:
///   - allgather when ranks <= 2: the same bytes as scatter_reduce (each rank
///     sends one payload of the whole buffer), one round instead of two, and
///     one compression instead of two;
///   - allgather for top-k up to 16 ranks: its payloads are small, and
///     re-sparsifying a chunk sum (scatter_reduce's second compression) drops
///     what the first kept;
///   - scatter_reduce otherwise: 2(P-1)/P payloads per rank instead of P-1.
Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, int ranks);

/// Chunk j of a buffer of n elements split over `ranks` ranks: the first
/// n % ranks chunks have one element more. Empty chunks are fine (n < ranks).
struct ChunkRange {
  std::size_t offset = 0;
  std::size_t count = 0;
};
ChunkRange chunk_range(std::size_t n, int ranks, int j);

/// The documented single-call error of a codec's allreduce (docs/comm.md):
/// the relative L2 error ||out - exact|| / ||exact|| of one call from a zero EF
/// state on N(0, 1)-like inputs, either algorithm, up to 16 ranks. Error
/// feedback then drives the running sum toward the exact one over steps.
double allreduce_error_bound(const CodecConfig& codec);

/// Time spent in each phase of the last call on this rank, and bytes sent.
struct AllreduceStats {
  Algorithm algorithm = Algorithm::Auto;  ///< what ran
  double encode_s = 0, comm_s = 0, decode_s = 0, total_s = 0;
  std::size_t wire_bytes = 0;  ///< payload bytes this rank sent to other ranks
  bool agreed = false;         ///< this call ran the Store agreement
};

/// Error-feedback state of one gradient buffer: the worker residual (n
/// floats) and, for scatter_reduce, the server residual of this rank's chunk.
/// Created as zeros on first use, in the buffer's memory (host or CUDA);
/// persistent across calls; bound from then on to one layout (codec spec, n,
/// rank, world size, algorithm). save()/restore() carry it across a
/// checkpoint, and a restored state continues bit-identically.
class AllreduceState {
 public:
  AllreduceState() = default;
  AllreduceState(const AllreduceState&) = delete;
  AllreduceState& operator=(const AllreduceState&) = delete;
  AllreduceState(AllreduceState&&) = default;
  AllreduceState& operator=(AllreduceState&&) = default;

  /// Serialises the layout and residuals (a copy from the device if needed).
  /// Throws InvalidArgument on a state that was never used or restored.
  std::string save() const;
  /// Loads what save() wrote. Throws InvalidArgument for malformed bytes, or
  /// when this state is already bound to a different layout.
  void restore(std::string_view bytes);
  /// Forgets layout and residuals: the next call starts from zeros.
  void reset();

  bool bound() const { return layout_.has_value(); }
  /// Bytes of residual memory held.
  std::size_t bytes() const { return worker_.capacity() + server_.capacity(); }

  /// What a state is bound to.
  struct Layout {
    std::string codec;  ///< canonical spec
    std::uint64_t n = 0;
    std::uint32_t rank = 0, world = 0;
    Algorithm algorithm = Algorithm::Allgather;
    std::uint64_t worker_count = 0, server_count = 0;  ///< residual floats
    bool operator==(const Layout&) const = default;
  };
  const std::optional<Layout>& layout() const { return layout_; }

 private:
  friend struct AllreduceRun;
  std::optional<Layout> layout_;
  Device device_ = Device::Cpu;
  Buffer worker_, server_;
  std::vector<float> pending_worker_, pending_server_;  // restored, not yet on the device
  bool pending_ = false;
  // The last call signature the ranks agreed on, so later calls skip the Store.
  struct Agreed {
    CodecConfig codec;
    std::uint64_t n = 0;
    Algorithm algorithm = Algorithm::Auto;
    ReduceOp op = ReduceOp::Sum;
  };
  std::optional<Agreed> agreed_;
  std::uint64_t agreed_context_ = 0;  // which workspace/transport agreed
};

/// Scratch shared by every allreduce on one transport: payload slots, the
/// chunk sum and the codec's workspace, grown to the largest call and reused;
/// and the count of agreements made (the same on every rank), which names the
/// Store keys of the next one. One call at a time.
class AllreduceWorkspace {
 public:
  AllreduceWorkspace();
  AllreduceWorkspace(const AllreduceWorkspace&) = delete;
  AllreduceWorkspace& operator=(const AllreduceWorkspace&) = delete;

  /// Payload slots + chunk sum (the part bounded by (P+1) payloads + n/P floats).
  std::size_t comm_bytes() const { return slots_.capacity() + sum_.capacity(); }
  /// The codec's own scratch.
  std::size_t codec_bytes() const { return codec_ws_.capacity() + status_.capacity(); }
  std::size_t bytes() const { return comm_bytes() + codec_bytes(); }

  /// The comm bytes a call needs: what bytes() grows to (for reports and
  /// tests of the bound).
  static std::size_t comm_bytes_for(const Codec& codec, std::size_t n, int ranks, int rank, Algorithm algorithm);

 private:
  friend struct AllreduceRun;
  Device device_ = Device::Cpu;
  Buffer slots_, sum_, codec_ws_;
  Buffer status_;  // CUDA: the decodes' PayloadStatus (checked once per phase, not per decode)
  std::uint64_t id_;
  std::uint64_t agreements_ = 0;
  // Per-call tables, sized once per world size.
  std::vector<Slice> recv_;
  std::vector<ConstSlice> send_;
  std::vector<std::size_t> received_;
  std::vector<PayloadRef> payloads_;
};

struct AllreduceOptions {
  Transport* transport = nullptr;       ///< [in] required
  Store* store = nullptr;               ///< [in] required when size() > 1 (agreement)
  AllreduceWorkspace* workspace = nullptr;  ///< [in,out] required
  Codec* codec = nullptr;               ///< [in] required (not thread-safe: one call at a time)
  AllreduceState* state = nullptr;      ///< [in,out] required
  float* buffer = nullptr;              ///< [in,out] n floats on `device` (null only when n == 0)
  std::size_t n = 0;
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
  Device device = Device::Cpu;
  Stream stream = nullptr;              ///< CUDA stream (Device::Cuda)
  Timeout timeout = default_timeout();  ///< for every wait of the call
  AllreduceStats* stats = nullptr;      ///< [out] optional; timing syncs the stream at phase ends
};

/// Runs one compressed allreduce; see the top of this file.
void allreduce(const AllreduceOptions& options);

}  // namespace gz

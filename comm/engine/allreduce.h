// Compressed allreduce: every rank hands in a float buffer and gets back the
// sum (or average) over all ranks, with the bytes on the wire compressed by
// a Codec with error feedback. Options struct + free function, as in gloo.
//
//   gz::AllreduceWorkspace ws;          // one per transport, shared by all states
//   gz::ErrorFeedback ef;               // one per gradient buffer (comm/engine/error_feedback.h)
//   gz::AllreduceOptions o;
//   o.transport = &transport; o.store = &store; o.workspace = &ws;
//   o.codec = codec.get(); o.state = &ef;
//   o.buffer = grad; o.n = n; o.op = gz::ReduceOp::Average;
//   gz::allreduce(o);                   // grad now holds the average, on every rank
//
// Pipelined: every algorithm cuts the buffer into segments (a few hundred
// KiB to a few MiB of payload each; AllreduceOptions::segment_bytes) and
// keeps two in flight: while segment s crosses the wire, segment s+1 is
// encoded and segment s-1 decoded, so the CPU (or GPU) work hides behind the
// transfers instead of adding to them (docs/comm.md).
//
// Constraints:
//   - Collective: every rank calls with the same codec spec, n, algorithm,
//     op and segment size, and the calls on one transport come in the same
//     order on every rank. The first call on a state (and any call whose
//     signature differs from the last one agreed) checks this through the
//     Store; a mismatch throws InvalidArgument on every rank, naming the ranks
//     and values that differ.
//   - Deterministic: every rank ends with bit-identical results (all decode the
//     same payloads in the same rank order). For none, fp16, bf16 and onebit
//     (segments on block boundaries) the result does not depend on the
//     segment size either; top-k selects per segment (docs/comm.md).
//   - In place: `buffer` is read, then overwritten with the result.
//   - 16-bit buffers (dtype float16 / bfloat16): the call widens the buffer
//     exactly into a float buffer of the workspace, runs on that (payloads,
//     sums and the fp32 paths are float; codec none sends the widened
//     floats), and rounds the result once into the buffer (to nearest even:
//     Codec's rule, the same on every rank). The EF state stays float. The
//     dtype is part of the agreement.
//   - Memory: buffers are allocated on the first call (or when a larger call
//     comes) and reused; see AllreduceWorkspace::bytes().
//   - Device::Cuda: buffer, EF state and workspace are device memory; work is
//     queued on `stream` and the call returns when the result is complete.
//   - Errors: InvalidArgument (bad input, mismatched ranks, mismatched state),
//     PayloadError (a peer sent a malformed payload: the transport is aborted,
//     as the collective cannot finish), IoError (a peer died or timed out:
//     rebuild the transport).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/engine/collective.h"
#include "comm/engine/error_feedback.h"
#include "comm/base/memory.h"
#include "comm/store/store.h"
#include "comm/engine/topology.h"
#include "comm/transports/transport.h"
#include "compressors/codec.h"

namespace gz {

namespace detail {
struct Run;
}
struct AlgorithmDescriptor;

/// The codec scatter_reduce re-encodes the chunk sums with (its second,
/// "server" phase) when AllreduceOptions::server_codec is unset:
///   - onebit: fp16. A chunk sum is compressed once, for every rank, so its
///     error is not averaged over the ranks as the first phase's is, and its
///     error feedback holds part of every step's sum back for later steps:
///     a onebit server phase delays the gradient and cost 3 points of
///     accuracy on digits at 4 ranks, 19 at 8 (docs/comm.md, "The server
///     phase"). fp16 adds only its rounding (error feedback carries it).
///   - every other codec: itself (top-k k=K: per segment as the first phase).
/// The error feedback follows the codec's (ef=off: none in either phase).
CodecConfig server_codec_config(const CodecConfig& codec);

/// What a caller's server codec argument means, the same at every entry
/// point (C++, Python, the torch layer): unset, the default above; "same",
/// `codec` itself; anything else, that spec. Throws InvalidArgument for a
/// malformed spec.
CodecConfig server_codec_config(const CodecConfig& codec, const std::optional<std::string>& given);

/// Payload bytes per element of a long run of `codec` (headers aside);
/// top-k: at its density.
double payload_bytes_per_element(const CodecConfig& codec);

/// What Auto runs for `codec` on `ranks` ranks: the algorithm that sends
/// fewer bytes per rank, allgather (P-1) payloads of c bytes per element,
/// scatter_reduce (P-1)/P x (c + s), s the server codec's; so allgather while
/// P <= 1 + s/c (ties: allgather, one round and one compression):
///   - allgather when ranks <= 2 (s = c for every codec's own server phase);
///   - onebit (block 512: c = 0.14, s = fp16's 2): allgather up to 15 ranks;
///   - top-k: allgather up to 16 ranks: its payloads are small, and
///     re-sparsifying a chunk sum (scatter_reduce's second compression) drops
///     what the first kept;
///   - scatter_reduce otherwise: 2(P-1)/P payloads per rank instead of P-1.
/// `server`: the call's server codec (AllreduceOptions::server_codec); null:
/// the default one (server_codec_config). The rule is the descriptors'
/// (comm/algorithms/algorithm.h: auto_candidate, auto_priority, auto_bytes),
/// so a registered algorithm takes part by its own file.
Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, int ranks,
                            const CodecConfig* server = nullptr);
Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const TopologyShape& shape,
                            const CodecConfig* server = nullptr);
/// Auto's rule among the algorithms `allowed` accepts (hierarchical: those
/// that run as a phase over a group of ranks, across its nodes).
Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const TopologyShape& shape,
                            const CodecConfig* server, bool (*allowed)(const AlgorithmDescriptor&));
/// The same with the ranks' nodes known: Auto runs hierarchical when there are
/// several nodes of the same size, several ranks each (the local traffic then
/// moves uncompressed over the fast path, and only the shards cross the slow
/// links, compressed); otherwise the rule above over all ranks. An explicit
/// Hierarchical needs nodes of one size (else InvalidArgument).
Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const Topology& topology,
                            const CodecConfig* server = nullptr);

/// Payload bytes of one pipeline segment when AllreduceOptions::segment_bytes
/// is 0: about 1 MiB (measured, docs/comm.md).
inline constexpr std::size_t kDefaultSegmentBytes = std::size_t{1} << 20;


/// The documented single-call error of a codec's allreduce (docs/comm.md):
/// the relative L2 error ||out - exact|| / ||exact|| of one call from a zero EF
/// state on N(0, 1)-like inputs, either algorithm, up to 16 ranks. Error
/// feedback then drives the running sum toward the exact one over steps.
double allreduce_error_bound(const CodecConfig& codec);

/// Where the time of the last call on this rank went, and bytes sent.
/// encode and decode overlap the transfers, so the parts add up to more
/// than total: hidden = comm - wait is the compute that ran while bytes
/// moved. On CUDA encode and decode are GPU time (events); with NCCL the
/// waits are on the device, so comm and wait are not seen from the host.
struct AllreduceStats {
  Algorithm algorithm = Algorithm::Auto;  ///< what ran
  double encode_s = 0;   ///< in the codec's encode (error feedback included)
  double decode_s = 0;   ///< in decoding and summing payloads (fp32: the sums)
  double comm_s = 0;     ///< with at least one exchange in flight
  double wait_s = 0;     ///< blocked waiting for an exchange: the comm not hidden
  double total_s = 0;
  std::size_t wire_bytes = 0;    ///< payload bytes this rank sent to other ranks
  std::size_t remote_bytes = 0;  ///< the part of wire_bytes sent to ranks on other nodes
  std::size_t segments = 0;     ///< pipeline steps (segments of the largest phase)
  bool agreed = false;         ///< this call ran the Store agreement
};

/// Scratch shared by every allreduce on one transport: payload slots for the
/// segments in flight, the chunk sums and the codec's workspace, grown to the
/// largest call and reused; and the count of agreements made (the same on
/// every rank), which names the Store keys of the next one. One call at a time.
class AllreduceWorkspace {
 public:
  AllreduceWorkspace();
  ~AllreduceWorkspace();
  AllreduceWorkspace(const AllreduceWorkspace&) = delete;
  AllreduceWorkspace& operator=(const AllreduceWorkspace&) = delete;

  /// Payload slots and chunk sums.
  std::size_t comm_bytes() const { return slots_.capacity() + sum_.capacity(); }
  /// The codec's own scratch.
  std::size_t codec_bytes() const { return codec_ws_.capacity() + status_.capacity(); }
  /// The float copy of a 16-bit buffer (none for float buffers).
  std::size_t wide_bytes() const { return wide_.capacity(); }
  std::size_t bytes() const { return comm_bytes() + codec_bytes() + wide_bytes(); }

  /// The comm bytes a call needs: what comm_bytes() grows to (for reports and
  /// tests of the bound). For codec none on the CPU the payloads are the
  /// floats themselves (no copy), so only the receives need slots.
  static std::size_t comm_bytes_for(const Codec& codec, std::size_t n, int ranks, int rank, Algorithm algorithm,
                                    std::size_t segment_bytes = 0, const Topology* topology = nullptr,
                                    Device device = Device::Cpu,
                                    const std::optional<CodecConfig>& server_codec = std::nullopt);

 private:
  friend struct detail::Run;
  Device device_ = Device::Cpu;
  MemoryKind slot_kind_ = MemoryKind::Host;
  Buffer slots_, sum_, codec_ws_;
  Buffer wide_;    // a 16-bit call's buffer, widened to float
  Buffer status_;  // CUDA: the decodes' PayloadStatus (checked once per phase, not per decode)
  std::uint64_t id_;
  std::uint64_t agreements_ = 0;
  // Top-k with k=K cut into segments: each segment selects at the spec's
  // rate (K / n), as this codec (docs/comm.md). Made on first use.
  std::unique_ptr<Codec> segment_codec_;
  std::unique_ptr<Codec> none_codec_;  // hierarchical on a device: the node's fp32 payloads
  std::unique_ptr<Codec> server_codec_;  // scatter_reduce's chunk sums, when not the first phase's codec
  // Per-call tables, sized once per world size: the ops of one exchange, the
  // bytes received per slot (one row per segment in flight), payloads and
  // inputs of one sum.
  std::vector<SendOp> sends_;
  std::vector<RecvOp> recvs_;
  std::vector<std::size_t> received_;
  std::vector<PayloadRef> payloads_;
  std::vector<const float*> inputs_;
};

struct AllreduceOptions {
  Transport* transport = nullptr;       ///< [in] required
  Store* store = nullptr;               ///< [in] required when size() > 1 (agreement)
  AllreduceWorkspace* workspace = nullptr;  ///< [in,out] required
  Codec* codec = nullptr;               ///< [in] required (not thread-safe: one call at a time)
  ErrorFeedback* state = nullptr;       ///< [in,out] required: this buffer's error feedback
  void* buffer = nullptr;               ///< [in,out] n elements of `dtype` on `device` (null only when n == 0)
  std::size_t n = 0;
  Dtype dtype = Dtype::Float32;         ///< float32, float16 or bfloat16; the same on every rank
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
  Device device = Device::Cpu;
  Stream stream = nullptr;              ///< CUDA stream (Device::Cuda)
  Timeout timeout = default_timeout();  ///< for every wait of the call
  /// Payload bytes per pipeline segment (0: kDefaultSegmentBytes). Rounded to
  /// whole elements (onebit: whole blocks); at least one block of 64
  /// elements; the same on every rank.
  std::size_t segment_bytes = 0;
  /// The ranks' nodes (Hierarchical, and Auto's choice); null: every rank a
  /// node of its own. The same on every rank (Communicator discovers it).
  const Topology* topology = nullptr;
  /// The codec scatter_reduce re-encodes the chunk sums with (also
  /// hierarchical's scatter_reduce across nodes); unset:
  /// server_codec_config(codec). Its ef key is ignored: the server phase has
  /// error feedback when `codec` has. The same on every rank (agreed). Codec
  /// none takes only none (InvalidArgument).
  std::optional<CodecConfig> server_codec;
  AllreduceStats* stats = nullptr;      ///< [out] optional
};

/// Runs one compressed allreduce; see the top of this file.
void allreduce(const AllreduceOptions& options);

}  // namespace gz

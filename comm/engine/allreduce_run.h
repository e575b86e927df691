// The inside of one allreduce call: what every algorithm shares (checks,
// agreement, state, workspace, segments, flights), used by the algorithm
// files (comm/algorithms/). Internal to comm/.
//
// Words (as in gloo's ring()): a *chunk* is the part of the buffer one member
// of a group owns (chunk_range); a *segment* is the unit in flight, a run of
// `seg` elements of a chunk (or of the whole buffer, for allgather); a
// *payload* is one encoded segment; a *slot* is workspace room for one
// payload; a *flight* is one exchange of the transport, started and not yet
// finished.
#pragma once

#include <chrono>
#include <vector>

#include "comm/engine/allreduce.h"
#include "comm/base/phase_timer.h"
#include "common/workspace.h"

namespace gz::detail {

using Clock = std::chrono::steady_clock;

/// The ranks a phase runs over: member i is transport rank ranks[i].
struct Group {
  std::vector<int> ranks;
  int me = 0;  ///< this rank's index in ranks
  int size() const { return static_cast<int>(ranks.size()); }
};

/// Slots and sums are carved from the workspace in a fixed order; with a
/// null base the carver only counts, which is how a workspace is sized: the
/// same code lays out the slots and measures them (each algorithm returns
/// right after carving when sizing()).
using Carve = WorkspaceCarver;

/// Segment s of a run of `count` elements cut every `seg` elements (empty
/// past the end).
inline ChunkRange segment(std::size_t count, std::size_t seg, std::size_t s) {
  const std::size_t off = s * seg;
  return off >= count ? ChunkRange{count, 0} : ChunkRange{off, count - off < seg ? count - off : seg};
}
inline std::size_t segment_count(std::size_t count, std::size_t seg) { return (count + seg - 1) / seg; }

/// Slot sets in flight: two, or one when there is only one segment.
inline std::size_t sets_for(std::size_t segments) { return segments < 2 ? segments : 2; }

/// A raw message must be exactly what the receiver expects (PayloadError).
void expect_floats(std::size_t received, std::size_t count, int rank);

/// `count` slots of `bytes` each, for each segment in flight (`sets`),
/// carved in one piece.
struct Slots {
  std::byte* base = nullptr;
  std::size_t stride = 0, per_set = 0;
  Slots() = default;
  Slots(Carve& c, std::size_t sets, std::size_t count, std::size_t bytes);
  std::byte* at(std::size_t set, std::size_t i) const { return base + (set * per_set + i) * stride; }
  float* floats(std::size_t set, std::size_t i) const { return reinterpret_cast<float*>(at(set, i)); }
};

/// One exchange in flight, and when it started.
struct Flight {
  Transport::Exchange x;
  bool live = false;
  Clock::time_point start;
};

/// What a phase writes its result with: the codec's payloads, or (codec none
/// on host buffers) the floats themselves, sent from and received into the
/// buffer without a copy.
/// Whether this codec's payloads differ in size for the same count (allreduce.cc).
bool payload_size_varies(const Codec& c);

struct Wire {
  Codec* codec = nullptr;  ///< the codec of the phase's segments (may differ from the user's: top-k k=K)
  Codec* server = nullptr; ///< scatter_reduce: the codec of the chunk sums' segments (may be `codec`)
  bool raw = false;
  std::size_t seg = 1;     ///< elements per segment
  /// scatter_reduce: its chunks are cut on runs of this many elements
  /// (chunk_range with a grain: the codec's blocks, flat_wire); 1 for the
  /// chunks of reduce_scatter() and hierarchical's shards.
  std::size_t grain = 1;

  /// The codec of the payloads a flat algorithm's last step leaves (what
  /// hierarchical keeps and shares): allgather's, or scatter_reduce's chunk sums.
  Codec* kept(Algorithm a) const { return algorithm_descriptor(a).server_phase ? server : codec; }
};

/// One call of allreduce() or reduce_scatter() (o.algorithm ReduceScatter):
/// checks, agreement, state, workspace, the algorithm. `name` is for errors.
void run_collective(const AllreduceOptions& o, const char* name);

/// One call: the options, checked, plus what the algorithms share.
struct Run {
  const AllreduceOptions& o;
  Transport* t;  // null while only sizing a workspace (comm_bytes_for)
  Codec& codec;
  ErrorFeedback& st;
  AllreduceWorkspace& ws;
  int P = 1, me = 0;
  Algorithm algo = Algorithm::Auto;
  Topology topo;           // o.topology or flat
  std::size_t seg = 0;     // elements per segment (the user codec's; phases may refine)
  CodecConfig server_cfg;  // the chunk sums' codec: o.server_codec or the default, ef as the codec's
  bool raw = false;        // codec none on host buffers: no payloads
  float* floats = nullptr;  // the float buffer the algorithms run on: o.buffer, or its widened copy
  CallContext call;           // the caller's buffers (synchronize)
  CallContext exchange_call;  // the payload slots the exchanges move
  ExecContext exec;
  AllreduceStats stats;
  PhaseTimer timer;
  bool exact;          // the transport reports received sizes; else send what the receive posts (send_payload)
  bool device_memory;  // the transport takes device buffers (NCCL)
  std::vector<std::pair<Clock::time_point, Clock::time_point>> busy;  // flights' [start, end]
  // The workspace's per-call tables (sized in prepare_workspace): the ops of
  // one exchange, the bytes received per slot (a row per exchange in
  // flight), the payloads of one sum.
  std::vector<SendOp>& send_ops;
  std::vector<RecvOp>& recv_ops;
  std::vector<std::size_t>& received_bytes;
  std::vector<PayloadRef>& payload_refs;

  explicit Run(const AllreduceOptions& opt);
  /// Sizing only: the layout of a call on `ranks` ranks, no transport.
  Run(const AllreduceOptions& opt, int ranks, int rank, bool exact_sizes, bool device_memory);

  // allreduce.cc: agreement, state, workspace.
  void agree_and_bind();
  ErrorFeedback::Layout check_state() const;
  void bind_state(ErrorFeedback::Layout layout);
  void prepare_workspace();
  /// Runs the algorithm in the prepared workspace.
  void execute();
  /// A 16-bit call: widens o.buffer into `floats`, or rounds them back into it.
  void convert(bool to_float);
  /// The workspace bytes (slots, sums) this call lays out, from dry runs.
  std::pair<std::size_t, std::size_t> layout_bytes();
  void finish_stats(Clock::time_point start);

  // What the algorithms (comm/algorithms/) share.
  /// Sums the members' contributions to one segment of `count` elements into
  /// `target`, in member order (the first overwrites, the last scales): their
  /// floats in `slots` (raw; this member's are `own`), or their payloads there
  /// (this member's of `own_bytes`); `received` holds the bytes that arrived,
  /// per member.
  void sum_segment(const Group& g, const Wire& w, const Slots& slots, std::size_t set, const std::size_t* received,
                   const float* own, std::size_t own_bytes, std::size_t count, std::size_t cap, float scale_by,
                   float* target);
  /// Bytes of a kept payload of a segment of `count` elements at `slot`.
  std::size_t kept_size(const Codec& c, const std::byte* slot, std::size_t count, std::size_t cap) const;

  // Shared pieces.
  /// How a phase cuts a run of `unit` elements (the length the unsegmented
  /// call would encode: the buffer, or the largest chunk): the segment length
  /// (o.segment_bytes of payload of the larger of the two codecs, whole
  /// blocks of both, no longer than the run) and the codecs of a segment: the
  /// user's, or for top-k k=K one that keeps K/unit of each segment; and the
  /// server codec's, the same way (two_phase: scatter_reduce; else the
  /// server is `codec` and plays no part).
  Wire wire_for(std::size_t unit, bool two_phase);
  /// The same for uncompressed traffic (hierarchical inside a node): raw
  /// floats on the host, the none codec's payloads on a device.
  Wire fp32_wire(std::size_t unit);
  /// Elements per segment for payloads of `codec` (from o.segment_bytes).
  std::size_t segment_elems(const Codec& c, bool raw_floats) const;
  Group world() const;

  Flight start(std::span<const SendOp> sends, std::span<const RecvOp> recvs);
  void finish(Flight& f);   // waits (timed as wait_s)
  void poke(Flight& f);     // progress; finishes it if done
  void abort_flights(std::span<Flight> flights, const char* why);
  /// Before the transport reads what kernels wrote (a host transport under
  /// CUDA: the payload slots are pinned memory the GPU wrote).
  void before_send();

  float* worker_residual(std::size_t offset) const {
    return codec.error_feedback() ? static_cast<float*>(st.worker_.data()) + offset : nullptr;
  }
  float* server_residual() const {
    return codec.error_feedback() ? static_cast<float*>(st.server_.data()) : nullptr;
  }
  // Payloads on the wire. A fixed-size codec's header holds nothing the
  // call's agreement has not already fixed on every rank (codec, param,
  // element count, body size: the count of every segment of every chunk
  // follows from n, P and the codec), so such a payload crosses *bare*, as
  // its body alone, and the receiver writes the header it expects in front
  // of what arrived (arrived()). The decode then checks that payload as any
  // other: a body of the wrong size is a PayloadError (truncated or trailing
  // bytes), and nothing past the slot is read. Bare where the slots are host
  // memory (every host transport); a device transport (NCCL) sends the
  // header too. A codec whose size varies (top-k) always sends its header:
  // it says how many entries follow.
  bool bare(const Codec& c) const { return !device_memory && c.fixed_size(); }
  // What to send of a payload of `bytes` of `count` elements of codec `c` at
  // `slot`: bare, its body; else the payload itself, or (a transport without
  // exact sizes, where a receive must be posted with the size sent) the
  // codec's bound for `count`. Never the whole slot: a segment may be
  // shorter than its slot (the last one, a smaller chunk), and its slot's
  // bytes past the payload would cross the wire for nothing.
  ConstSlice send_payload(const std::byte* slot, std::size_t bytes, const Codec& c, std::size_t count) const;
  // Where to receive a payload of `count` elements of `c` into a slot of
  // `capacity`: the slot (bare: past the header's room), whole on a
  // transport with exact sizes (it reports what arrived), else exactly what
  // the sender sends (send_payload).
  Slice recv_payload(std::byte* slot, const Codec& c, std::size_t count, std::size_t capacity) const;
  // The payload of `count` elements of `c` that arrived in `slot`
  // (`received`: the bytes the transport reported), ready to decode: a bare
  // body gets its expected header written in front of it.
  PayloadRef arrived(std::byte* slot, std::size_t received, std::size_t capacity, const Codec& c, std::size_t count);
  // Throws PayloadError if a GPU decode of this call rejected a payload
  // (synchronizes the stream). CPU decodes throw on the spot.
  void check_decodes();
  // What the last decode multiplies by: 1/P for an average.
  float scale() const { return o.op == ReduceOp::Average ? 1.0f / static_cast<float>(P) : 1.0f; }
};

}  // namespace gz::detail

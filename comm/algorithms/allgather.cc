// allgather: every rank's payload of the whole buffer to every rank.
#include <algorithm>

#include "comm/algorithms/flat.h"
#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce.h"
#include "common/error.h"

namespace gz::detail {

// allgather
//
// Segment s of the buffer: this member encodes it (worker EF) into its own
// slot and sends that payload to every other member, receiving theirs into
// their slots; then all P payloads are summed into the segment in member
// order (decode_sum: the first overwrites, the last scales), the same
// additions in the same order on every rank, so every rank gets the same
// bits. Raw (fp32 on the host): the segment itself is sent and the received
// floats summed with it in place. Traffic per rank: (P-1) payloads.
void allgather(Run& run, const Group& g, float* buf, float* residual, std::size_t count, float scale_by, Wire w,
               Carve& wire_carve, Slots* keep) {
  const auto Pg = static_cast<std::size_t>(g.size()), m = static_cast<std::size_t>(g.me);
  const std::size_t S = segment_count(count, w.seg);
  const std::size_t cap = w.raw ? 4 * w.seg : w.codec->max_payload_bytes(w.seg);
  // Two slot sets reused by parity; or, to keep them, one per segment.
  const Slots slots(wire_carve, keep ? S : sets_for(S), Pg, cap);
  if (keep) *keep = slots;
  auto set_of = [&](std::size_t s) { return keep ? s : s % 2; };
  run.stats.segments = std::max(run.stats.segments, S);
  if (wire_carve.sizing()) return;

  auto received = [&](std::size_t k, std::size_t i) -> std::size_t& { return run.received_bytes[k * Pg + i]; };
  Flight flights[2];
  auto post = [&](std::size_t s) {
    const std::size_t k = s % 2, set = set_of(s);
    const ChunkRange r = segment(count, w.seg, s);
    ConstSlice out{buf + r.offset, 4 * r.count};
    if (!w.raw) {
      run.timer.begin();
      const std::size_t bytes = w.codec->encode(buf + r.offset, residual ? residual + r.offset : nullptr, r.count,
                                                slots.at(set, m), cap, run.exec);
      run.timer.end(&run.stats.encode_s);
      received(k, m) = bytes;
      out = run.send_payload(slots.at(set, m), bytes, *w.codec, r.count);
      run.before_send();
    }
    run.send_ops.clear();
    run.recv_ops.clear();
    for (std::size_t i = 0; i < Pg; ++i) {
      if (i == m) continue;
      run.send_ops.push_back({g.ranks[i], out});
      // Raw floats: receive exactly the segment, as a transport without
      // exact sizes (torch's process group, NCCL) needs sends and receives
      // of one size.
      run.recv_ops.push_back({g.ranks[i],
                              w.raw ? Slice{slots.at(set, i), 4 * r.count}
                                    : run.recv_payload(slots.at(set, i), *w.codec, r.count, cap),
                              &received(k, i)});
    }
    flights[k] = run.start(run.send_ops, run.recv_ops);
  };
  auto finish_segment = [&](std::size_t s) {
    const std::size_t k = s % 2;
    const ChunkRange r = segment(count, w.seg, s);
    run.finish(flights[k]);
    run.sum_segment(g, w, slots, set_of(s), &received(k, 0), buf + r.offset, received(k, m), r.count, cap, scale_by,
                buf + r.offset);
  };

  try {
    if (S > 0) post(0);
    for (std::size_t s = 0; s < S; ++s) {
      if (s + 1 < S) post(s + 1);
      finish_segment(s);
    }
    run.check_decodes();
  } catch (...) {
    run.abort_flights(flights, "allgather failed on this rank");
    throw;
  }
}

namespace {

void run_allgather(Run& run, Carve& wire, Carve& local) {
  flat(run, Algorithm::Allgather, run.world(), run.floats, run.worker_residual(0), run.server_residual(), run.o.n,
       run.scale(), wire, local);
}

// Rank me's bytes: its payload of the whole buffer to each of the P-1 others.
WireCost allgather_cost(const CostQuery& q) {
  const Topology& topo = *q.topology;
  const int P = topo.ranks();
  const double each = payload_bytes(q.codec, q.n);
  WireCost c;
  for (int j = 0; j < P; ++j) {
    if (j == q.rank) continue;
    c.bytes += each;
    if (topo.node[static_cast<std::size_t>(j)] != topo.node[static_cast<std::size_t>(q.rank)]) c.remote_bytes += each;
  }
  c.messages = static_cast<std::uint64_t>(P - 1);
  c.rounds = P > 1 ? 1 : 0;
  return c;
}

std::pair<std::uint64_t, std::uint64_t> allgather_residuals(const CodecConfig&, std::uint64_t n, int, const Topology&) {
  return {n, 0};  // the worker residual of the whole buffer
}

// auto: always a candidate (one round, one compression); (P-1) payloads.
bool allgather_candidate(const CodecConfig&, const TopologyShape&) { return true; }
double allgather_auto_bytes(double c, double, int ranks) { return (ranks - 1) * c; }

Prediction allgather_predict(const CostInputs& in) { return flat_allgather_prediction(in, world_group(in), in.n); }

double allgather_memory(const CostInputs& in) {
  const double n = static_cast<double>(in.n), P = in.ranks, c = codec_bytes(in);
  const double ef = in.ef && !in.raw ? 8.0 : 0.0;  // residual read and written
  if (in.raw) return P * 4 * n + 4 * n;            // the sum reads P arrays, writes one
  return (4 + ef + c) * n + P * c * n + 4 * n;       // encode; decode_sum of P payloads into out
}

double allgather_bytes_per_peer(const CostInputs& in) { return codec_bytes(in) * static_cast<double>(in.n); }

// As a phase over a group: the whole run encoded, cut into segments.
Wire allgather_wire(Run& run, int, std::size_t unit_count) { return run.wire_for(unit_count, false); }
std::size_t allgather_segments(int, std::size_t count, const Wire& w) { return segment_count(count, w.seg); }
void allgather_phase(Run& run, const Group& g, float* buf, float* residual, float*, std::size_t count, float scale_by,
                     const Wire& w, Carve& wire_carve, Carve&, Slots* keep) {
  allgather(run, g, buf, residual, count, scale_by, w, wire_carve, keep);
}
std::size_t allgather_kept_count(std::size_t count, int, const Wire& w, std::size_t s, std::size_t) {
  return segment(count, w.seg, s).count;
}
// Segment s: the sum of every member's payload of it.
void allgather_decode_kept(Run& run, int members, const Wire& w, const Slots& kept, std::size_t s, std::size_t count,
                           float* buf, float scale_by, Codec& kc, std::size_t cap) {
  const ChunkRange r = segment(count, w.seg, s);
  run.payload_refs.clear();
  for (std::size_t j = 0; j < static_cast<std::size_t>(members); ++j)
    run.payload_refs.push_back({kept.at(s, j), run.kept_size(kc, kept.at(s, j), r.count, cap)});
  kc.decode_sum(run.payload_refs, buf + r.offset, r.count, scale_by, run.exec);
}

const FlatPhase allgather_flat{allgather_wire,     allgather_segments,    allgather_phase,
                               allgather_kept_count, allgather_decode_kept, flat_allgather_prediction};

}  // namespace
}  // namespace gz::detail

namespace gz::algorithms {

extern const AlgorithmDescriptor allgather{
    .name = "allgather",
    .id = Algorithm::Allgather,
    .summary = "every rank's payload of the whole buffer to every rank, summed in rank order; (P-1) payloads per rank",
    .state_version = 1,
    .run = detail::run_allgather,
    .residual_counts = detail::allgather_residuals,
    .wire_cost = detail::allgather_cost,
    .auto_candidate = detail::allgather_candidate,
    .auto_bytes = detail::allgather_auto_bytes,
    .predict = detail::allgather_predict,
    .memory_bytes = detail::allgather_memory,
    .bytes_per_peer = detail::allgather_bytes_per_peer,
    .flat = &detail::allgather_flat,
};

}  // namespace gz::algorithms

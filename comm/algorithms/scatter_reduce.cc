// scatter_reduce: the two-phase compressed allreduce (reduce-scatter of
// compressed chunks, then an allgather of the chunk sums re-encoded with the
// server codec).
#include <algorithm>

#include "comm/algorithms/flat.h"
#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce.h"
#include "common/error.h"

namespace gz::detail {

// scatter_reduce (two-phase compressed allreduce, as in DeepSpeed)
//
// The buffer is split into P chunks (chunk_range on runs of w.grain
// elements: the codec's blocks, so that the chunks' payloads hold no more
// blocks than one payload of the whole buffer; sizes differ by at most one
// run, some may be empty); member j owns chunk j. Every chunk is cut into
// segments of the same length, and segment s of every chunk moves together:
//   1. scatter: segment s of chunk j is encoded (worker EF) and sent to
//      member j; this member receives every member's payload of its own
//      chunk's segment s (slot area B; the own one is encoded there too).
//   2. reduce: those P payloads are summed in member order into the chunk
//      sum, which is encoded again, with the server codec (w.server:
//      fp16 for onebit, else the codec itself; server_codec_config) and the
//      server EF, and sent to every member (area G).
//   3. gather: every member's payload of segment s of its chunk is decoded
//      into the buffer (overwrite, scaled); the owner too decodes its own
//      payload rather than keep its exact sum, so every rank gets the same
//      bits.
// Three stages, two segments in flight: scatter(s+1) and gather(s) run while
// reduce and decode work. Traffic per rank: (P-1)/P payloads of the codec
// plus (P-1)/P of the server codec (2(P-1)/P payloads when they are one).
//
// Raw (fp32 on the host): the same exchanges without payloads: chunks are
// sent from the buffer, the owner sums the received floats into its chunk
// in place (scaled: no second rounding), sends the sum from there, and the
// other chunks are received straight into the buffer. With this, none is
// reduce-scatter + allgather with one pass over the owner's chunk.
//
// Half::ReduceOnly stops after step 2's sum (written into the buffer's own
// chunk, scaled); Half::GatherOnly starts at step 2's send of the buffer's
// own chunk. Hierarchical runs them apart, inside a node.
void scatter_reduce(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count,
                    float scale_by, Wire w, Carve& wire_carve, Carve& local, Half half, Slots* keep) {
  const auto Pg = static_cast<std::size_t>(g.size()), m = static_cast<std::size_t>(g.me);
  auto chunk = [&](std::size_t j) { return chunk_range(count, g.size(), static_cast<int>(j), w.grain); };
  const ChunkRange own = chunk(m);
  const std::size_t S = segment_count(chunk(0).count, w.seg);  // chunk 0 is the largest
  const std::size_t cap = w.raw ? 4 * w.seg : w.codec->max_payload_bytes(w.seg), sets = sets_for(S);
  const std::size_t cap_g = w.raw ? cap : w.server->max_payload_bytes(w.seg);  // the chunk sums' payloads
  const bool scatter = half != Half::GatherOnly, gather = half != Half::ReduceOnly;
  // Raw needs room only for what it receives into a slot: the scatter's payloads.
  const Slots A(wire_carve, w.raw || !scatter ? 0 : sets, Pg, cap);
  const Slots B(wire_carve, scatter ? sets : 0, Pg, cap);
  // The gather's slots: two sets reused by parity; or, to keep them, one per segment.
  const Slots G(wire_carve, w.raw || !gather ? 0 : keep ? S : sets, Pg, cap_g);
  if (keep) *keep = G;
  auto gset = [&](std::size_t s) { return keep ? s : s % 2; };
  float* sums = w.raw || half != Half::Both ? nullptr : local.add<float>(sets * w.seg);
  run.stats.segments = std::max(run.stats.segments, S);
  if (wire_carve.sizing()) return;

  // Received bytes: rows 0, 1 for the scatter of each set, rows 2, 3 for the
  // gather (both may be in flight at once).
  auto received = [&](std::size_t row, std::size_t i) -> std::size_t& { return run.received_bytes[row * Pg + i]; };
  std::size_t own_bytes[2] = {0, 0};  // this member's payload in B, per set
  Flight flights[4];                  // scatter: 0, 1; gather: 2, 3
  auto seg_of = [&](std::size_t j, std::size_t s) {  // segment s of chunk j, in buffer offsets
    const ChunkRange c = chunk(j), r = segment(c.count, w.seg, s);
    return ChunkRange{c.offset + r.offset, r.count};
  };

  // 1. scatter
  auto scatter_step = [&](std::size_t s) {
    if (!scatter) return;
    const std::size_t k = s % 2;
    run.send_ops.clear();
    run.recv_ops.clear();
    for (std::size_t j = 0; j < Pg; ++j) {
      const ChunkRange r = seg_of(j, s);
      ConstSlice out{buf + r.offset, 4 * r.count};
      if (!w.raw) {
        std::byte* dst = j == m ? B.at(k, m) : A.at(k, j);
        run.timer.begin();
        const std::size_t bytes =
            w.codec->encode(buf + r.offset, residual ? residual + r.offset : nullptr, r.count, dst, cap, run.exec);
        run.timer.end(&run.stats.encode_s);
        if (j == m) own_bytes[k] = bytes;
        out = run.send_payload(dst, bytes, *w.codec, r.count);
        for (Flight& f : flights) run.poke(f);  // what is in flight keeps moving
      }
      if (j == m) continue;
      run.send_ops.push_back({g.ranks[j], out});
      // Raw floats: exactly this member's own segment (see allgather).
      const std::size_t mine = seg_of(m, s).count;
      run.recv_ops.push_back(
          {g.ranks[j], w.raw ? Slice{B.at(k, j), 4 * mine} : run.recv_payload(B.at(k, j), *w.codec, mine, cap),
           &received(k, j)});
    }
    if (!w.raw) run.before_send();
    flights[k] = run.start(run.send_ops, run.recv_ops);
  };

  // 2. reduce (and send the chunk's sum)
  auto reduce_step = [&](std::size_t s) {
    const std::size_t k = s % 2;
    const ChunkRange r = seg_of(m, s);
    if (scatter) {
      run.finish(flights[k]);
      // Into the chunk sum to compress again, or (raw, or a half) the
      // buffer's own chunk, scaled: no second rounding.
      const bool again = half == Half::Both && !w.raw;
      run.sum_segment(g, w, B, k, &received(k, 0), buf + r.offset, own_bytes[k], r.count, cap, again ? 1.0f : scale_by,
                  again ? sums + k * w.seg : buf + r.offset);
    }
    if (!gather) return;
    ConstSlice out{buf + r.offset, 4 * r.count};
    if (!w.raw) {
      if (half == Half::Both) run.check_decodes();  // never send on a sum of a rejected payload
      const float* from = half == Half::Both ? sums + k * w.seg : buf + r.offset;
      float* ef = half == Half::Both && server ? server + (r.offset - own.offset) : nullptr;
      run.timer.begin();
      const std::size_t bytes = w.server->encode(from, ef, r.count, G.at(gset(s), m), cap_g, run.exec);
      run.timer.end(&run.stats.encode_s);
      received(2 + k, m) = bytes;
      out = run.send_payload(G.at(gset(s), m), bytes, *w.server, r.count);
      run.before_send();
    }
    run.send_ops.clear();
    run.recv_ops.clear();
    for (std::size_t j = 0; j < Pg; ++j) {
      if (j == m) continue;
      const ChunkRange rj = seg_of(j, s);
      run.send_ops.push_back({g.ranks[j], out});
      run.recv_ops.push_back({g.ranks[j],
                           w.raw ? Slice{buf + rj.offset, 4 * rj.count}
                                 : run.recv_payload(G.at(gset(s), j), *w.server, rj.count, cap_g),
                           &received(2 + k, j)});
    }
    flights[2 + k] = run.start(run.send_ops, run.recv_ops);
  };

  // 3. gather
  auto gather_step = [&](std::size_t s) {
    if (!gather) return;
    const std::size_t k = s % 2;
    run.finish(flights[2 + k]);
    if (w.raw) {
      for (std::size_t j = 0; j < Pg; ++j)
        if (j != m) expect_floats(received(2 + k, j), seg_of(j, s).count, g.ranks[j]);
      return;
    }
    run.timer.begin();
    for (std::size_t j = 0; j < Pg; ++j) {
      const ChunkRange r = seg_of(j, s);
      std::byte* slot = G.at(gset(s), j);
      const PayloadRef p =
          j == m ? PayloadRef{slot, received(2 + k, m)} : run.arrived(slot, received(2 + k, j), cap_g, *w.server, r.count);
      w.server->decode_sum(std::span(&p, 1), buf + r.offset, r.count, scale_by, run.exec);  // overwrite, scaled
    }
    run.timer.end(&run.stats.decode_s);
  };

  try {
    if (S > 0) scatter_step(0);
    for (std::size_t s = 0; s < S; ++s) {
      if (s + 1 < S) scatter_step(s + 1);
      reduce_step(s);
      if (s >= 1) gather_step(s - 1);
    }
    if (S > 0) gather_step(S - 1);
    run.check_decodes();
  } catch (...) {
    run.abort_flights(flights, "scatter_reduce failed on this rank");
    throw;
  }
}

namespace {

void run_scatter_reduce(Run& run, Carve& wire, Carve& local) {
  flat(run, Algorithm::ScatterReduce, run.world(), run.floats, run.worker_residual(0), run.server_residual(), run.o.n,
       run.scale(), wire, local);
}

// Rank me's bytes: chunk j's payload to rank j (j != me), then its own
// chunk's sum, server codec, to the P-1 others (chunks on the codec's blocks).
WireCost scatter_reduce_cost(const CostQuery& q) {
  const Topology& topo = *q.topology;
  const int P = topo.ranks();
  const std::size_t grain = chunk_grain(q.codec, q.n, P);
  const double mine = payload_bytes(q.server, chunk_range(q.n, P, q.rank, grain).count);
  WireCost c;
  for (int j = 0; j < P; ++j) {
    if (j == q.rank) continue;
    const double both = payload_bytes(q.codec, chunk_range(q.n, P, j, grain).count) + mine;
    c.bytes += both;
    if (topo.node[static_cast<std::size_t>(j)] != topo.node[static_cast<std::size_t>(q.rank)]) c.remote_bytes += both;
  }
  c.messages = 2 * static_cast<std::uint64_t>(P - 1);
  c.rounds = P > 1 ? 2 : 0;
  return c;
}

std::pair<std::uint64_t, std::uint64_t> scatter_reduce_residuals(const CodecConfig& codec, std::uint64_t n, int rank,
                                                                 const Topology& topo) {
  // The worker residual of the whole buffer; the server residual of this rank's chunk sum.
  return {n, chunk_range(n, topo.ranks(), rank, chunk_grain(codec, n, topo.ranks())).count};
}

// auto: a candidate above the ranks up to which the codec prefers allgather
// (top-k: re-sparsifying a chunk sum drops what the first phase kept);
// (P-1)/P payloads of each codec.
bool scatter_reduce_candidate(const CodecConfig& codec, const TopologyShape& shape) {
  return shape.ranks > codec.descriptor().hint.allgather_up_to_ranks;
}
double scatter_reduce_auto_bytes(double c, double s, int ranks) { return (ranks - 1) * (c + s) / ranks; }

Prediction scatter_reduce_predict(const CostInputs& in) {
  return flat_scatter_reduce_prediction(in, world_group(in), in.n);
}

double scatter_reduce_memory(const CostInputs& in) {
  const double n = static_cast<double>(in.n), P = in.ranks, c = codec_bytes(in), s = server_bytes(in);
  const double ef = in.ef && !in.raw ? 8.0 : 0.0;  // residual read and written
  if (in.raw) return (P * 4 + 4) * n / P;          // the owner's sum of its chunk
  const double chunk = n / P;
  return (4 + ef + c) * n                          // scatter: every chunk encoded
         + P * c * chunk + 4 * chunk               // reduce: P payloads into the chunk sum
         + (4 + ef + s) * chunk                    // the sum encoded again
         + P * s * chunk + 4 * n;                  // gather: every chunk's payload into the buffer
}

double scatter_reduce_bytes_per_peer(const CostInputs& in) {
  return (codec_bytes(in) + server_bytes(in)) * static_cast<double>(in.n) / in.ranks;
}

// As a phase over a group: chunks on the codec's blocks (chunk_grain), the
// largest one's cut for all.
Wire scatter_reduce_wire(Run& run, int members, std::size_t unit_count) {
  const std::size_t grain = run.raw ? 1 : chunk_grain(run.codec.config(), unit_count, members);
  Wire w = run.wire_for(chunk_range(unit_count, members, 0, grain).count, true);
  w.grain = grain;
  return w;
}
void scatter_reduce_phase(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count,
                          float scale_by, const Wire& w, Carve& wire_carve, Carve& local, Slots* keep) {
  scatter_reduce(run, g, buf, residual, server, count, scale_by, w, wire_carve, local, Half::Both, keep);
}
std::size_t scatter_reduce_kept_count(std::size_t count, int members, const Wire& w, std::size_t s, std::size_t j) {
  return segment(chunk_range(count, members, static_cast<int>(j), w.grain).count, w.seg, s).count;
}
// Segment s: each chunk's payload (its owner's sum) into its place.
void scatter_reduce_decode_kept(Run& run, int members, const Wire& w, const Slots& kept, std::size_t s,
                                std::size_t count, float* buf, float scale_by, Codec& kc, std::size_t cap) {
  for (std::size_t j = 0; j < static_cast<std::size_t>(members); ++j) {
    const ChunkRange c = chunk_range(count, members, static_cast<int>(j), w.grain), r = segment(c.count, w.seg, s);
    const PayloadRef p{kept.at(s, j), run.kept_size(kc, kept.at(s, j), r.count, cap)};
    kc.decode_sum(std::span(&p, 1), buf + c.offset + r.offset, r.count, scale_by, run.exec);
  }
}

const FlatPhase scatter_reduce_flat{scatter_reduce_wire,       chunk_segments,             scatter_reduce_phase,
                                    scatter_reduce_kept_count, scatter_reduce_decode_kept, flat_scatter_reduce_prediction};

}  // namespace
}  // namespace gz::detail

namespace gz::algorithms {

extern const AlgorithmDescriptor scatter_reduce{
    .name = "scatter_reduce",
    .id = Algorithm::ScatterReduce,
    .summary = "compressed reduce-scatter, then an allgather of the chunk sums re-encoded with the server codec; "
               "(P-1)/P payloads of each codec per rank",
    .server_phase = true,
    .state_version = 1,
    .run = detail::run_scatter_reduce,
    .residual_counts = detail::scatter_reduce_residuals,
    .wire_cost = detail::scatter_reduce_cost,
    .auto_candidate = detail::scatter_reduce_candidate,
    .auto_bytes = detail::scatter_reduce_auto_bytes,
    .predict = detail::scatter_reduce_predict,
    .memory_bytes = detail::scatter_reduce_memory,
    .bytes_per_peer = detail::scatter_reduce_bytes_per_peer,
    .flat = &detail::scatter_reduce_flat,
};

}  // namespace gz::algorithms

// ring: the ring allreduce of Baidu's and Horovod's allreduce, compressed.
//
// The buffer is split into P chunks (chunk_range on the codec's blocks, as
// scatter_reduce cuts them); rank r sends only to rank r+1 and receives only
// from rank r-1 (mod P):
//   1. reduce-scatter, P-1 steps: at step t rank r encodes its partial sum
//      of chunk r-t (its own gradient at t = 0, then what it summed at the
//      step before) with the worker EF of that chunk and sends it on; it
//      decodes chunk r-t-1 from rank r-1 into its own gradient of that chunk.
//      Every hop re-encodes a partial sum, with its own residual: the error
//      feedback follows the sums as they travel (each rank encodes P-1
//      different chunks per call, so its worker residual covers the buffer).
//      After step P-2 rank r holds the whole sum of chunk r+1.
//   2. allgather, P-1 steps: rank r encodes that sum once, with the server
//      codec and the server EF of chunk r+1, and the payloads travel on
//      around the ring unchanged (each rank forwards what it received the
//      step before). Every rank decodes every chunk's payload into the
//      buffer (overwrite, scaled), its own too, so every rank gets the same
//      bits.
// Each step moves its chunk in segments, two in flight. Traffic per rank:
// (P-1)/P payloads of each codec, as scatter_reduce, but to one peer in
// 2(P-1) steps instead of to P-1 peers in 2: P-1 times fewer messages per
// step, 2(P-1) latencies, and the partial sums are compressed P-1 times.
//
// Raw (fp32 on the host): the same steps with floats: the partial sums are
// added in place, the owner scales its chunk once, and the gather receives
// straight into the buffer and forwards from there.
#include <algorithm>

#include "comm/algorithms/flat.h"
#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce.h"
#include "common/error.h"

namespace gz::detail {
namespace {

std::size_t ring_grain(const CodecConfig& codec, bool raw, std::uint64_t count, int members) {
  return raw ? 1 : chunk_grain(codec, count, members);
}

// The chunk this rank holds whole after the reduce-scatter, and so the one
// its server residual covers.
int owned_chunk(int rank, int members) { return (rank + 1) % members; }

void ring(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count, float scale_by,
          Carve& wire_carve) {
  const int Pg = g.size(), m = g.me;
  const std::size_t grain = ring_grain(run.codec.config(), run.raw, count, Pg);
  auto chunk = [&](int j) { return chunk_range(count, Pg, ((j % Pg) + Pg) % Pg, grain); };
  Wire w = run.wire_for(chunk(0).count, /*two_phase=*/true);  // chunk 0 is the largest
  w.grain = grain;
  const std::size_t S = segment_count(chunk(0).count, w.seg);
  const std::size_t cap = w.raw ? 4 * w.seg : w.codec->max_payload_bytes(w.seg);
  const std::size_t cap_g = w.raw ? 0 : w.server->max_payload_bytes(w.seg);
  // Reduce: the payload this rank sends and the one it receives, two
  // segments in flight. Gather: every segment of a chunk, for the step's
  // payloads arriving and the ones it forwards.
  const Slots out(wire_carve, w.raw ? 0 : 2, 1, cap);
  const Slots in(wire_carve, 2, 1, cap);
  const Slots G(wire_carve, w.raw ? 0 : 2, S, cap_g);
  run.stats.segments = std::max(run.stats.segments, S);
  if (wire_carve.sizing()) return;

  const int next = g.ranks[static_cast<std::size_t>((m + 1) % Pg)];
  const int prev = g.ranks[static_cast<std::size_t>((m + Pg - 1) % Pg)];
  std::size_t* received = run.received_bytes.data();  // [s % 2]: the flight of segment s
  Flight flights[2];
  auto seg_of = [&](int j, std::size_t s) {
    const ChunkRange c = chunk(j), r = segment(c.count, w.seg, s);
    return ChunkRange{c.offset + r.offset, r.count};
  };
  auto exchange = [&](std::size_t s, ConstSlice send, Slice into) {
    run.send_ops.assign(1, SendOp{next, send});
    run.recv_ops.assign(1, RecvOp{prev, into, &received[s % 2]});
    flights[s % 2] = run.start(run.send_ops, run.recv_ops);
  };
  // Segments 0..S-1 of one step, two in flight: start(s), then finish(s-1).
  auto step = [&](auto&& start, auto&& finish) {
    for (std::size_t s = 0; s < S; ++s) {
      start(s);
      if (s >= 1) finish(s - 1);
    }
    if (S > 0) finish(S - 1);
  };

  try {
    // 1. reduce-scatter
    for (int t = 0; t + 1 < Pg; ++t) {
      if (t > 0 && !w.raw) run.check_decodes();  // never send on a sum of a rejected payload
      const int send_chunk = m - t, recv_chunk = m - t - 1;
      step(
          [&](std::size_t s) {
            const std::size_t k = s % 2;
            const ChunkRange mine = seg_of(send_chunk, s), theirs = seg_of(recv_chunk, s);
            ConstSlice send{buf + mine.offset, 4 * mine.count};
            if (!w.raw) {
              run.timer.begin();
              const std::size_t bytes = w.codec->encode(buf + mine.offset, residual ? residual + mine.offset : nullptr,
                                                        mine.count, out.at(k, 0), cap, run.exec);
              run.timer.end(&run.stats.encode_s);
              send = run.send_payload(out.at(k, 0), bytes, *w.codec, mine.count);
              run.before_send();
            }
            exchange(s, send,
                     w.raw ? Slice{in.at(k, 0), 4 * theirs.count}
                           : run.recv_payload(in.at(k, 0), *w.codec, theirs.count, cap));
            for (Flight& f : flights) run.poke(f);
          },
          [&](std::size_t s) {
            const std::size_t k = s % 2;
            run.finish(flights[k]);
            const ChunkRange theirs = seg_of(recv_chunk, s);
            run.timer.begin();
            if (w.raw) {
              expect_floats(received[k], theirs.count, prev);
              const float* add = in.floats(k, 0);
              float* into = buf + theirs.offset;
              for (std::size_t i = 0; i < theirs.count; ++i) into[i] += add[i];
            } else {
              const PayloadRef p = run.arrived(in.at(k, 0), received[k], cap, *w.codec, theirs.count);
              w.codec->decode_accumulate(p.data, p.bytes, buf + theirs.offset, theirs.count, run.exec);
            }
            run.timer.end(&run.stats.decode_s);
          });
    }

    // 2. the sum of the owned chunk, once: scaled in place (raw), or encoded
    // with the server codec and EF into gather set 0 and decoded back.
    const int own = owned_chunk(m, Pg);
    const ChunkRange owned = chunk(own);
    if (!w.raw) run.check_decodes();
    run.timer.begin();
    for (std::size_t s = 0; s < S; ++s) {
      const ChunkRange r = seg_of(own, s);
      if (w.raw) {
        if (scale_by != 1.0f)
          for (std::size_t i = 0; i < r.count; ++i) buf[r.offset + i] *= scale_by;
        continue;
      }
      float* ef = server ? server + (r.offset - owned.offset) : nullptr;
      const std::size_t bytes = w.server->encode(buf + r.offset, ef, r.count, G.at(0, s), cap_g, run.exec);
      const PayloadRef p{G.at(0, s), bytes};
      w.server->decode_sum(std::span(&p, 1), buf + r.offset, r.count, scale_by, run.exec);  // overwrite, scaled
    }
    run.timer.end(&run.stats.encode_s);

    // 3. allgather: step t forwards chunk m+1-t (set t % 2) and receives chunk m-t (set (t+1) % 2).
    for (int t = 0; t + 1 < Pg; ++t) {
      const int send_chunk = m + 1 - t, recv_chunk = m - t;
      const std::size_t from = static_cast<std::size_t>(t % 2), to = 1 - from;
      step(
          [&](std::size_t s) {
            const ChunkRange mine = seg_of(send_chunk, s), theirs = seg_of(recv_chunk, s);
            if (w.raw) {
              exchange(s, ConstSlice{buf + mine.offset, 4 * mine.count}, Slice{buf + theirs.offset, 4 * theirs.count});
              return;
            }
            const std::size_t bytes = run.kept_size(*w.server, G.at(from, s), mine.count, cap_g);
            if (t == 0) run.before_send();
            exchange(s, run.send_payload(G.at(from, s), bytes, *w.server, mine.count),
                     run.recv_payload(G.at(to, s), *w.server, theirs.count, cap_g));
            for (Flight& f : flights) run.poke(f);
          },
          [&](std::size_t s) {
            const std::size_t k = s % 2;
            run.finish(flights[k]);
            const ChunkRange theirs = seg_of(recv_chunk, s);
            if (w.raw) {
              expect_floats(received[k], theirs.count, prev);
              return;
            }
            run.timer.begin();
            const PayloadRef p = run.arrived(G.at(to, s), received[k], cap_g, *w.server, theirs.count);
            w.server->decode_sum(std::span(&p, 1), buf + theirs.offset, theirs.count, scale_by, run.exec);
            run.timer.end(&run.stats.decode_s);
          });
    }
    run.check_decodes();
  } catch (...) {
    run.abort_flights(flights, "ring failed on this rank");
    throw;
  }
}

void run_ring(Run& run, Carve& wire, Carve& local) {
  if (run.P == 1) {  // no ring: what allgather does alone (encode, decode its own payload)
    flat(run, Algorithm::Allgather, run.world(), run.floats, run.worker_residual(0), nullptr, run.o.n, run.scale(),
         wire, local);
    return;
  }
  ring(run, run.world(), run.floats, run.worker_residual(0), run.server_residual(), run.o.n, run.scale(), wire);
}

// Rank r's bytes: every chunk but r+1 once with the codec (the reduce-
// scatter's partial sums), every chunk but r+2 once with the server codec
// (the gather forwards them), all to rank r+1.
WireCost ring_cost(const CostQuery& q) {
  const Topology& topo = *q.topology;
  const int P = topo.ranks();
  WireCost c;
  if (P <= 1) return c;
  const std::size_t grain = ring_grain(q.codec, q.codec.descriptor().lossless, q.n, P);
  for (int j = 0; j < P; ++j) {
    if (j != (q.rank + 1) % P) c.bytes += payload_bytes(q.codec, chunk_range(q.n, P, j, grain).count);
    if (j != (q.rank + 2) % P) c.bytes += payload_bytes(q.server, chunk_range(q.n, P, j, grain).count);
  }
  const int next = (q.rank + 1) % P;
  if (topo.node[static_cast<std::size_t>(next)] != topo.node[static_cast<std::size_t>(q.rank)]) c.remote_bytes = c.bytes;
  c.messages = 2 * static_cast<std::uint64_t>(P - 1);
  c.rounds = 2 * (P - 1);
  return c;
}

std::pair<std::uint64_t, std::uint64_t> ring_residuals(const CodecConfig& codec, std::uint64_t n, int rank,
                                                       const Topology& topo) {
  // The worker residual of the whole buffer (every chunk a rank re-encodes
  // keeps its own); the server residual of the chunk it owns.
  const int P = topo.ranks();
  if (P <= 1) return {n, 0};  // allgather's alone
  return {n, chunk_range(n, P, owned_chunk(rank, P), ring_grain(codec, false, n, P)).count};
}

// auto: above 2 ranks, for codecs whose re-encoding at every hop is a
// rounding (a one-call error bound of at most 1%: fp16, bf16), which error
// feedback carries; there it ranks before scatter_reduce (priority 1):
// the same bytes, to one peer, measured 3-14% faster for fp16 and
// 15% faster in the DDP step with fp16 (BENCHMARKS.md section 13). A coarser
// codec's partial sums are compressed again at every hop: its error was
// 1.1x to 1.7x scatter_reduce's at about the same time, a cost in quality
// auto does not take on its own (algorithm="ring" runs it). Exact sums
// (none) keep scatter_reduce: its sums run in rank order, bit for bit the
// fp32 reference that BlockMomentum and the layer filters are held to; the
// ring's run in ring order.
constexpr double kRoundingOnly = 1e-2;
bool ring_candidate(const CodecConfig& codec, const TopologyShape& shape) {
  return shape.ranks > 2 && !codec.descriptor().lossless && allreduce_error_bound(codec) <= kRoundingOnly;
}
double ring_auto_bytes(double c, double s, int ranks) { return (ranks - 1) * (c + s) / ranks; }

// Time: 2(P-1) steps one after another, each a pipeline of one chunk's
// segments to one peer; the ring is as slow as its slowest hop, one that
// crosses a node's link when there are several nodes.
Prediction ring_predict(const CostInputs& in) {
  Prediction p;
  const int P = in.ranks;
  if (P <= 1 || in.n == 0) return p;
  const std::size_t chunk = chunk_range(in.n, P, 0).count;  // the largest
  const double c = codec_bytes(in), s = server_bytes(in);
  const std::size_t seg = model_segment_elems(chunk, std::max(c, s), in.segment_bytes);
  const std::size_t S = segment_count(chunk, seg);
  const double m = static_cast<double>(chunk) / static_cast<double>(S);
  const bool remote = in.per_node < P;  // some hop crosses a link
  const CostGroup hop{2, remote ? 0 : 1, 1};
  // A step's segments go to one peer, two in flight: the step waits for one
  // exchange's latency, and its transfers follow one another behind it. The
  // measured latency is an exchange with every peer (a barrier: 15 us at 2
  // ranks, 460 us at 8 on 2 cores); a hop has one peer, 1/(P-1) of it.
  const double lat = remote ? in.link.latency_s / (P - 1) : 0.0;
  // reduce: encode a partial sum, decode one payload into the next
  const double e1 = in.raw ? 0.0 : m * in.codec.encode_s;
  const double d1 = (in.raw ? sum_seconds(in, m, 1) : decode_seconds(in.codec, m, 1)) + transport_cpu_seconds(in, hop, m * c);
  const double w1 = exchange_seconds(in, hop, m * c) - (remote ? in.link.latency_s : 0.0);  // its bytes' time
  // gather: forward one payload, decode it
  const double d2 = (in.raw ? 0.0 : decode_seconds(in.server, m, 1)) + transport_cpu_seconds(in, hop, m * s);
  const double w2 = exchange_seconds(in, hop, m * s) - (remote ? in.link.latency_s : 0.0);
  const double steps = P - 1;
  p.segments = S;
  p.total_s = steps * (pipeline_seconds(S, e1 * in.compute_share, d1 * in.compute_share, w1) +
                       pipeline_seconds(S, 0, d2 * in.compute_share, w2) + 2 * lat) +
              (in.raw ? 0.0 : chunk * in.server.encode_s * in.compute_share);
  p.compute_s = (steps * S * (e1 + d1 + d2) + (in.raw ? 0.0 : chunk * in.server.encode_s)) * in.compute_share;
  p.wire_s = steps * (S * (w1 + w2) + 2 * lat);
  return p;
}

double ring_memory(const CostInputs& in) {
  const double n = static_cast<double>(in.n), P = in.ranks, c = codec_bytes(in), s = server_bytes(in);
  const double ef = in.ef && !in.raw ? 8.0 : 0.0;
  const double chunk = n / P;
  if (in.raw) return 3 * 4 * n + 4 * n;            // the P-1 partial sums read and written, the gather written
  return (P - 1) * chunk * (4 + ef + c)           // every hop's partial sum encoded
         + (P - 1) * chunk * (c + 8)              // and the received one decoded into the next
         + chunk * (4 + ef + s)                   // the owned sum, once
         + P * chunk * (s + 4);                   // every chunk's payload decoded into the buffer
}

double ring_bytes_per_peer(const CostInputs& in) {
  // Everything goes to one peer, (P-1)/P payloads of each codec over this
  // rank's link: as much as scatter_reduce's (c + s) n / P to each of P-1
  // peers (memory_limit's link term spreads it over the P-1).
  return (codec_bytes(in) + server_bytes(in)) * static_cast<double>(in.n) / in.ranks;
}

}  // namespace
}  // namespace gz::detail

namespace gz::algorithms {

// ring: partial sums around the ring, then the sums around again.
extern const AlgorithmDescriptor ring{
    .name = "ring",
    .id = Algorithm::Ring,
    .summary = "the ring allreduce (Horovod's): P-1 hops of re-encoded partial sums (worker EF per chunk), then "
               "each chunk's sum, server codec, around the ring; (P-1)/P payloads of each codec per rank, to one peer",
    .server_phase = true,
    .run = detail::run_ring,
    .residual_counts = detail::ring_residuals,
    .wire_cost = detail::ring_cost,
    .auto_candidate = detail::ring_candidate,
    .auto_priority = 1,
    .auto_bytes = detail::ring_auto_bytes,
    .predict = detail::ring_predict,
    .memory_bytes = detail::ring_memory,
    .bytes_per_peer = detail::ring_bytes_per_peer,
};

}  // namespace gz::algorithms

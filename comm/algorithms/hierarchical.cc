// hierarchical
//
// Words: a *node* is the ranks that share a machine (Topology); a rank's
// *local group* is its node, and its *column* the ranks with the same local
// index on every node (one per node). With L ranks per node and N nodes:
//   1. reduce-scatter inside the node, uncompressed: the buffer is split into
//      L shards (chunk_range over the local group), and local member l ends
//      with shard l summed over its node, in place;
//   2. a compressed allreduce of shard l across the column: the flat
//      algorithm Auto picks for N ranks, with this rank's worker EF over its
//      shard (and server EF over its column chunk), scaled by 1/P for an
//      average;
//   3. allgather inside the node: every member gets every shard. Of the
//      payloads step 2 decoded last: each rank keeps them and passes them to
//      its node, and every rank decodes its partners' shards itself, as
//      their owners did (fp32 on the host: the shards themselves, into
//      place).
// Only step 2 crosses the slow links, compressed: n/L elements per rank,
// once; step 1 moves (L-1)/L x 4n bytes per rank over the fast local path
// (UCX shared memory), step 3 a few compressed payloads. Every rank of a
// column decodes the same payloads in the same order, and so do the members
// of a node, so every rank gets the same bits. The phases run one after
// another, each pipelined.
#include <algorithm>
#include <vector>

#include "comm/algorithms/flat.h"
#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce.h"
#include "common/error.h"

namespace gz::detail {
namespace {

void share_with_node(Run& run, const Group& node, Algorithm inner, int N, const Slots& kept, std::size_t largest_shard,
                     Carve& wire_carve);

void hierarchical(Run& run, Carve& wire_carve, Carve& local) {
  const int node = run.topo.node[static_cast<std::size_t>(run.me)];
  Group nodes_ranks;
  nodes_ranks.ranks = run.topo.members(node);
  nodes_ranks.me = static_cast<int>(std::find(nodes_ranks.ranks.begin(), nodes_ranks.ranks.end(), run.me) -
                                    nodes_ranks.ranks.begin());
  const int N = run.topo.nodes();
  Group column;
  for (int k = 0; k < N; ++k) column.ranks.push_back(run.topo.members(k)[static_cast<std::size_t>(nodes_ranks.me)]);
  column.me = node;
  const ChunkRange shard = chunk_range(run.o.n, nodes_ranks.size(), nodes_ranks.me);
  const Algorithm inner = inner_algorithm(run.codec.config(), N);

  // The node's own traffic is fp32: the floats themselves on the host, the
  // none codec's payloads on a device.
  const std::size_t largest_shard = chunk_range(run.o.n, nodes_ranks.size(), 0).count;
  const Wire fp32 = run.fp32_wire(largest_shard);
  float* shard_buf = run.floats ? run.floats + shard.offset : nullptr;

  // The phases run one after another, each laying out its slots from the
  // start of the workspace; the call needs the largest of them.
  std::size_t wire_bytes = 0, local_bytes = 0;
  auto phase = [&](auto&& body) {
    Carve w = wire_carve, l = local;  // fresh carvers over the same memory
    body(w, l);
    wire_bytes = std::max(wire_bytes, w.bytes());
    local_bytes = std::max(local_bytes, l.bytes());
  };
  phase([&](Carve& w, Carve& l) {
    scatter_reduce(run, nodes_ranks, run.floats, nullptr, nullptr, run.o.n, 1.0f, fp32, w, l, Half::ReduceOnly);
  });
  if (run.raw) {  // fp32: the shards themselves go round the node
    phase([&](Carve& w, Carve& l) {
      flat(run, inner, column, shard_buf, run.worker_residual(0), run.server_residual(), shard.count, run.scale(), w, l);
    });
    phase([&](Carve& w, Carve& l) {
      scatter_reduce(run, nodes_ranks, run.floats, nullptr, nullptr, run.o.n, 1.0f, fp32, w, l, Half::GatherOnly);
    });
  } else {  // compressed: the payloads go round the node, and every rank decodes them
    phase([&](Carve& w, Carve& l) {
      Slots kept;
      flat(run, inner, column, shard_buf, run.worker_residual(0), run.server_residual(), shard.count, run.scale(), w, l, &kept,
           largest_shard);
      share_with_node(run, nodes_ranks, inner, N, kept, largest_shard, w);
    });
  }
  wire_carve.add<std::byte>(wire_bytes);
  local.add<std::byte>(local_bytes);
}

// Step 3: this rank's kept payloads (flat's last step over its shard) to
// every other member of its node, theirs from each, each decoded into its
// shard. One exchange of one message per payload, each of its own size
// (send_payload / recv_payload: never the whole slot, whose room past a short
// segment's payload would cross for nothing).
void share_with_node(Run& run, const Group& node, Algorithm inner, int N, const Slots& kept, std::size_t largest_shard,
                     Carve& wire_carve) {
  const auto L = static_cast<std::size_t>(node.size()), m = static_cast<std::size_t>(node.me);
  const auto Nn = static_cast<std::size_t>(N);
  const Wire w = flat_wire(run, inner, N, largest_shard);  // what every member's step 2 used
  Codec& kc = *w.kept(inner);
  const std::size_t cap = kc.max_payload_bytes(w.seg);
  auto shard_of = [&](std::size_t l) { return chunk_range(run.o.n, static_cast<int>(L), static_cast<int>(l)); };
  auto segments_of = [&](std::size_t l) { return flat_segments(inner, N, shard_of(l).count, w); };
  // Elements of kept payload (segment s, member j) of a shard of `count`:
  // allgather's segment s of the shard; scatter_reduce's of chunk j.
  auto count_of = [&](std::size_t count, std::size_t s, std::size_t j) {
    return flat_phase(inner).kept_count(count, N, w, s, j);
  };
  std::vector<Slots> theirs(L);
  for (std::size_t l = 0; l < L; ++l)
    if (l != m) theirs[l] = Slots(wire_carve, segments_of(l), Nn, cap);
  if (wire_carve.sizing()) return;

  // Received bytes: one per (member, segment, payload), past the rows the
  // flat phases use.
  std::size_t messages = 0;
  for (std::size_t l = 0; l < L; ++l)
    if (l != m) messages += segments_of(l) * Nn;
  std::vector<std::size_t> got(messages);
  run.send_ops.clear();
  run.recv_ops.clear();
  const std::size_t mine = shard_of(m).count;
  std::size_t next = 0;
  for (std::size_t l = 0; l < L; ++l) {
    if (l == m) continue;
    for (std::size_t s = 0; s < segments_of(m); ++s)
      for (std::size_t j = 0; j < Nn; ++j) {
        const std::size_t c = count_of(mine, s, j);
        const std::size_t bytes = run.kept_size(kc, kept.at(s, j), c, cap);
        run.send_ops.push_back({node.ranks[l], run.send_payload(kept.at(s, j), bytes, kc, c)});
      }
    const std::size_t theirs_count = shard_of(l).count;
    for (std::size_t s = 0; s < segments_of(l); ++s)
      for (std::size_t j = 0; j < Nn; ++j)
        run.recv_ops.push_back(
            {node.ranks[l], run.recv_payload(theirs[l].at(s, j), kc, count_of(theirs_count, s, j), cap), &got[next++]});
  }
  Flight f = run.start(run.send_ops, run.recv_ops);
  try {
    run.finish(f);
  } catch (...) {
    run.abort_flights(std::span(&f, 1), "hierarchical failed on this rank");
    throw;
  }
  // A payload must be what arrived (a transport with exact sizes says; else
  // the sender sent the bound, and the header says within it); a bare body
  // gets its header here, and decode_kept checks its size.
  next = 0;
  for (std::size_t l = 0; l < L; ++l) {
    if (l == m) continue;
    const std::size_t theirs_count = shard_of(l).count;
    for (std::size_t s = 0; s < segments_of(l); ++s)
      for (std::size_t j = 0; j < Nn; ++j, ++next) {
        const std::size_t c = count_of(theirs_count, s, j);
        const PayloadRef p = run.arrived(theirs[l].at(s, j), got[next], cap, kc, c);
        if (run.exact && p.bytes != run.kept_size(kc, theirs[l].at(s, j), c, cap))
          GZ_THROW(PayloadError, "rank ", node.ranks[l], " passed a payload of ", got[next], " bytes for ", c,
                   " elements whose header says otherwise (the ranks disagree on the call)");
      }
    decode_kept(run, inner, N, w, theirs[l], theirs_count, run.floats + shard_of(l).offset, run.scale());
  }
  run.check_decodes();
}

// This rank's place: its node's members (local group), its index there,
// and its column (one rank per node).
struct Place {
  int L = 0, N = 0, local = 0, node = 0;
};
Place place_of(int rank, const Topology& topo) {
  Place p;
  p.node = topo.node[static_cast<std::size_t>(rank)];
  const auto members = topo.members(p.node);
  p.L = static_cast<int>(members.size());
  p.N = topo.nodes();
  p.local = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  return p;
}

WireCost hierarchical_cost(const CostQuery& q) {
  const Topology& topo = *q.topology;
  GZ_ENFORCE(topo.uniform_size() > 0, "the hierarchical allreduce needs the same number of ranks on every node; here ",
             topo.describe());
  const Place p = place_of(q.rank, topo);
  const bool lossless = q.codec.descriptor().lossless;
  WireCost c;
  // 1. fp32 reduce-scatter inside the node: each other member's shard.
  for (int l = 0; l < p.L; ++l)
    if (l != p.local) c.bytes += 4.0 * static_cast<double>(chunk_range(q.n, p.L, l).count);
  // 2. the shard across the nodes, with what Auto runs on N ranks (all remote).
  const std::uint64_t shard = chunk_range(q.n, p.L, p.local).count;
  const Algorithm inner = inner_algorithm(q.codec, p.N);
  const Topology column = Topology::flat(p.N);
  CostQuery across = q;
  across.n = shard;
  across.rank = p.node;
  across.topology = &column;
  const WireCost x = algorithm_descriptor(inner).wire_cost(across);
  c.bytes += x.bytes;
  c.remote_bytes += x.bytes;
  // 3. the node's other members get this shard: its floats (lossless), or
  // the payloads step 2 decoded last, which every member decodes itself
  // (scatter_reduce's chunks cut as for the node's largest shard).
  const std::size_t grain = chunk_grain(q.codec, chunk_range(q.n, p.L, 0).count, p.N);
  double kept = 4.0 * static_cast<double>(shard);
  if (!lossless) {
    kept = 0;
    for (int j = 0; j < p.N; ++j)
      kept += !algorithm_descriptor(inner).server_phase
                  ? payload_bytes(q.codec, shard)
                  : payload_bytes(q.server, chunk_range(shard, p.N, j, grain).count);
  }
  c.bytes += static_cast<double>(p.L - 1) * kept;
  c.messages = 2 * static_cast<std::uint64_t>(p.L - 1) + x.messages;
  c.rounds = (p.L > 1 ? 2 : 0) + x.rounds;
  return c;
}

std::pair<std::uint64_t, std::uint64_t> hierarchical_residuals(const CodecConfig& codec, std::uint64_t n, int rank,
                                                               const Topology& topo) {
  // This rank's shard of its node, and (when the nodes run scatter_reduce
  // across) its node's chunk of that shard.
  const Place p = place_of(rank, topo);
  const std::uint64_t shard = chunk_range(n, p.L, p.local).count;
  const Algorithm inner = inner_algorithm(codec, p.N);
  // Chunks cut as flat cuts them for every shard of a node: by the largest.
  const std::size_t grain = chunk_grain(codec, chunk_range(n, p.L, 0).count, p.N);
  return {shard, algorithm_descriptor(inner).server_phase ? chunk_range(shard, p.N, p.node, grain).count : 0};
}

// auto: several nodes of the same size, several ranks each (the local
// traffic then moves uncompressed over the fast path, and only the shards
// cross the slow links, compressed): before any flat algorithm.
bool hierarchical_candidate(const CodecConfig&, const TopologyShape& shape) {
  return shape.nodes >= 2 && shape.per_node >= 2;
}

// The cost model: its three phases one after another, each pipelined.
Prediction hierarchical_predict(const CostInputs& in) {
  const int L = in.per_node;
  if (L < 2 || in.ranks % L != 0)
    GZ_THROW(InvalidArgument, "the hierarchical cost needs nodes of 2 or more ranks, got ", in.ranks, " ranks, ", L,
             " per node");
  const int N = in.ranks / L;
  const std::size_t shard = chunk_range(in.n, L, 0).count;  // the largest
  const CostGroup node{L, L - 1, 1}, column{N, 0, L};
  Prediction p;
  // 1. reduce-scatter inside the node, fp32 (the floats on the host).
  {
    const std::size_t seg = model_segment_elems(shard, 4.0, in.segment_bytes);
    const std::size_t S = segment_count(shard, seg);
    const double m = static_cast<double>(shard) / static_cast<double>(S);
    const double d = (sum_seconds(in, m, L) + transport_cpu_seconds(in, node, 4 * m)) * in.compute_share;
    const double w = exchange_seconds(in, node, 4 * m);
    p.total_s += pipeline_seconds(S, 0, d, w);
    p.compute_s += S * d;
    p.segments = S;
  }
  // 2. the compressed allreduce of the shard across the nodes.
  const Prediction across = flat_phase(in.inner).predict(in, column, shard);
  // What it kept: every member's payload of the whole shard, or (a server
  // phase) each member's chunk sum in the server codec.
  const bool gather = !algorithm_descriptor(in.inner).server_phase;
  p.total_s += across.total_s;
  p.compute_s += across.compute_s;
  p.wire_s += across.wire_s;
  p.segments = std::max(p.segments, across.segments);
  // 3. every shard to every member of the node: the fp32 shard (raw), or
  // the payloads flat kept, decoded by each member.
  const double per = static_cast<double>(shard);
  double bytes = 0, decode = 0;
  if (in.raw) {
    bytes = 4 * per;
  } else if (gather) {
    bytes = N * per * in.codec.bytes_per_element;
    decode = (L - 1) * decode_seconds(in.codec, per, N);
  } else {
    bytes = per * in.server.bytes_per_element;
    decode = (L - 1) * decode_seconds(in.server, per, 1);
  }
  decode = (decode + transport_cpu_seconds(in, node, bytes)) * in.compute_share;
  p.total_s += exchange_seconds(in, node, bytes) + decode;
  p.compute_s += decode;
  return p;
}

}  // namespace
}  // namespace gz::detail

namespace gz::algorithms {

extern const AlgorithmDescriptor hierarchical{
    .name = "hierarchical",
    .id = Algorithm::Hierarchical,
    .summary = "fp32 reduce-scatter inside each node, a compressed allreduce of each shard across the nodes, "
               "the shards' payloads shared inside each node",
    .follows_nodes = true,
    .run = detail::hierarchical,
    .residual_counts = detail::hierarchical_residuals,
    .wire_cost = detail::hierarchical_cost,
    .auto_candidate = detail::hierarchical_candidate,
    .auto_priority = 2,
    .predict = detail::hierarchical_predict,
};

}  // namespace gz::algorithms

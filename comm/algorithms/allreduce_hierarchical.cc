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

#include "comm/engine/allreduce_run.h"
#include "common/error.h"

namespace gz::detail {

void Run::hierarchical(Carve& wire_carve, Carve& local) {
  const int node = topo.node[static_cast<std::size_t>(me)];
  Group nodes_ranks;
  nodes_ranks.ranks = topo.members(node);
  nodes_ranks.me = static_cast<int>(std::find(nodes_ranks.ranks.begin(), nodes_ranks.ranks.end(), me) -
                                    nodes_ranks.ranks.begin());
  const int N = topo.nodes();
  Group column;
  for (int k = 0; k < N; ++k) column.ranks.push_back(topo.members(k)[static_cast<std::size_t>(nodes_ranks.me)]);
  column.me = node;
  const ChunkRange shard = chunk_range(o.n, nodes_ranks.size(), nodes_ranks.me);
  const Algorithm inner = resolve_algorithm(Algorithm::Auto, codec.config(), N);

  // The node's own traffic is fp32: the floats themselves on the host, the
  // none codec's payloads on a device.
  const std::size_t largest_shard = chunk_range(o.n, nodes_ranks.size(), 0).count;
  const Wire fp32 = fp32_wire(largest_shard);
  float* shard_buf = floats ? floats + shard.offset : nullptr;

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
    scatter_reduce(nodes_ranks, floats, nullptr, nullptr, o.n, 1.0f, fp32, w, l, Half::ReduceOnly);
  });
  if (raw) {  // fp32: the shards themselves go round the node
    phase([&](Carve& w, Carve& l) {
      flat(inner, column, shard_buf, worker_residual(0), server_residual(), shard.count, scale(), w, l);
    });
    phase([&](Carve& w, Carve& l) {
      scatter_reduce(nodes_ranks, floats, nullptr, nullptr, o.n, 1.0f, fp32, w, l, Half::GatherOnly);
    });
  } else {  // compressed: the payloads go round the node, and every rank decodes them
    phase([&](Carve& w, Carve& l) {
      Slots kept;
      flat(inner, column, shard_buf, worker_residual(0), server_residual(), shard.count, scale(), w, l, &kept,
           largest_shard);
      share_with_node(nodes_ranks, inner, N, kept, largest_shard, w);
    });
  }
  wire_carve.add<std::byte>(wire_bytes);
  local.add<std::byte>(local_bytes);
}

// Step 3: this rank's kept payloads (flat's last step over its shard) to
// every other member of its node, theirs from each, each decoded into its
// shard. One exchange: the payloads are few and compressed.
void Run::share_with_node(const Group& node, Algorithm inner, int N, const Slots& kept, std::size_t largest_shard,
                          Carve& wire_carve) {
  const auto L = static_cast<std::size_t>(node.size()), m = static_cast<std::size_t>(node.me);
  const Wire w = flat_wire(inner, N, largest_shard);  // what every member's step 2 used
  const std::size_t cap = w.kept(inner)->max_payload_bytes(w.seg);
  auto shard_of = [&](std::size_t l) { return chunk_range(o.n, static_cast<int>(L), static_cast<int>(l)); };
  auto segments_of = [&](std::size_t l) { return flat_segments(inner, N, shard_of(l).count, w.seg); };
  // Kept payloads lie [segment][member], slots of one stride, in one piece.
  auto blob_bytes = [&](std::size_t l) { return segments_of(l) * static_cast<std::size_t>(N) * kept.stride; };
  std::vector<Slots> theirs(L);
  for (std::size_t l = 0; l < L; ++l)
    if (l != m) theirs[l] = Slots(wire_carve, segments_of(l), static_cast<std::size_t>(N), cap);
  if (wire_carve.sizing()) return;

  ws.sends_.clear();
  ws.recvs_.clear();
  for (std::size_t l = 0; l < L; ++l) {
    if (l == m) continue;
    ws.sends_.push_back({node.ranks[l], ConstSlice{kept.base, blob_bytes(m)}});
    ws.recvs_.push_back({node.ranks[l], Slice{theirs[l].base, blob_bytes(l)}, &ws.received_[l]});
  }
  Flight f = start(ws.sends_, ws.recvs_);
  try {
    finish(f);
  } catch (...) {
    abort_flights(std::span(&f, 1), "hierarchical failed on this rank");
    throw;
  }
  for (std::size_t l = 0; l < L; ++l) {
    if (l == m) continue;
    if (exact && ws.received_[l] != blob_bytes(l))
      GZ_THROW(PayloadError, "rank ", node.ranks[l], " passed ", ws.received_[l], " bytes of payloads, expected ",
               blob_bytes(l), " (the ranks disagree on the call)");
    decode_kept(inner, N, w, theirs[l], shard_of(l).count, floats + shard_of(l).offset, scale());
  }
  check_decodes();
}

}  // namespace gz::detail

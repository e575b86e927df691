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
//   3. allgather inside the node, uncompressed: every member gets every
//      shard, into place.
// Only step 2 crosses the slow links, compressed: n/L elements per rank,
// once; steps 1 and 3 move 2(L-1)/L x 4n bytes per rank over the fast local
// path (UCX shared memory; the namespace's own loopback in the emulated
// cluster). Every rank of a column decodes the same payloads in the same
// order, and a node's members copy what its owner computed, so every rank
// gets the same bits. The phases run one after another, each pipelined.
#include <algorithm>

#include "comm/allreduce_run.h"
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
  const Wire fp32 = fp32_wire(chunk_range(o.n, nodes_ranks.size(), 0).count);
  float* shard_buf = o.buffer ? o.buffer + shard.offset : nullptr;

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
    scatter_reduce(nodes_ranks, o.buffer, nullptr, nullptr, o.n, 1.0f, fp32, w, l, Half::ReduceOnly);
  });
  phase([&](Carve& w, Carve& l) {
    flat(inner, column, shard_buf, worker_residual(0), server_residual(), shard.count, scale(), w, l);
  });
  phase([&](Carve& w, Carve& l) {
    scatter_reduce(nodes_ranks, o.buffer, nullptr, nullptr, o.n, 1.0f, fp32, w, l, Half::GatherOnly);
  });
  wire_carve.add<std::byte>(wire_bytes);
  local.add<std::byte>(local_bytes);
}

}  // namespace gz::detail

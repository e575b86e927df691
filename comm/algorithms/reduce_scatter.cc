// reduce_scatter: the first half of scatter_reduce as a collective of its
// own (reduce_scatter(), comm/engine/reduce_scatter.h): rank j ends with the
// sum of chunk j, decoded from every rank's payload of it.
#include "comm/algorithms/flat.h"

namespace gz::detail {
namespace {

void run_reduce_scatter(Run& run, Carve& wire, Carve& local) {
  flat(run, Algorithm::ReduceScatter, run.world(), run.floats, run.worker_residual(0), run.server_residual(), run.o.n,
       run.scale(), wire, local);
}

// Rank me's bytes: chunk j's payload to rank j (j != me).
WireCost reduce_scatter_cost(const CostQuery& q) {
  const Topology& topo = *q.topology;
  const int P = topo.ranks();
  WireCost c;
  for (int j = 0; j < P; ++j) {
    if (j == q.rank) continue;
    const double b = payload_bytes(q.codec, chunk_range(q.n, P, j).count);
    c.bytes += b;
    if (topo.node[static_cast<std::size_t>(j)] != topo.node[static_cast<std::size_t>(q.rank)]) c.remote_bytes += b;
  }
  c.messages = static_cast<std::uint64_t>(P - 1);
  c.rounds = P > 1 ? 1 : 0;
  return c;
}

std::pair<std::uint64_t, std::uint64_t> reduce_scatter_residuals(const CodecConfig&, std::uint64_t n, int,
                                                                 const Topology&) {
  return {n, 0};  // the worker residual of the whole buffer; no second phase
}

// As a phase: scatter_reduce's first half, on chunks of whole elements (the
// chunks its callers own), member j left with the sum of chunk j.
Wire reduce_scatter_wire(Run& run, int members, std::size_t unit_count) {
  return run.wire_for(chunk_range(unit_count, members, 0).count, true);
}
void reduce_scatter_phase(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count,
                          float scale_by, const Wire& w, Carve& wire_carve, Carve& local, Slots* keep) {
  scatter_reduce(run, g, buf, residual, server, count, scale_by, w, wire_carve, local, Half::ReduceOnly, keep);
}

const FlatPhase reduce_scatter_flat{reduce_scatter_wire, chunk_segments, reduce_scatter_phase};

}  // namespace
}  // namespace gz::detail

namespace gz::algorithms {

extern const AlgorithmDescriptor reduce_scatter{
    .name = "reduce_scatter",
    .id = Algorithm::ReduceScatter,
    .summary = "compressed reduce-scatter: rank j gets the sum of chunk j; (P-1)/P payloads per rank",
    .allreduce = false,
    .run = detail::run_reduce_scatter,
    .residual_counts = detail::reduce_scatter_residuals,
    .wire_cost = detail::reduce_scatter_cost,
    .flat = &detail::reduce_scatter_flat,
};

}  // namespace gz::algorithms

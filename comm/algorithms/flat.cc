// What the flat algorithms share (allgather.cc, scatter_reduce.cc) and what
// hierarchical.cc runs them through: the choice of segments and codec for a
// group, the dispatch, and the decoding of payloads they kept.
#include "comm/algorithms/flat.h"

#include "common/error.h"

namespace gz::detail {

Wire flat_wire(Run& run, Algorithm a, int members, std::size_t unit_count) {
  // allgather encodes the whole run; scatter_reduce its chunks, the first the
  // largest, cut on the codec's blocks (reduce_scatter(): on elements, the
  // chunks its callers own).
  if (a == Algorithm::Allgather) return run.wire_for(unit_count, false);
  const std::size_t grain =
      a == Algorithm::ScatterReduce && !run.raw ? chunk_grain(run.codec.config(), unit_count, members) : 1;
  Wire w = run.wire_for(chunk_range(unit_count, members, 0, grain).count, true);
  w.grain = grain;
  return w;
}

std::size_t flat_segments(Algorithm a, int members, std::size_t count, const Wire& w) {
  return segment_count(a == Algorithm::Allgather ? count : chunk_range(count, members, 0, w.grain).count, w.seg);
}

void flat(Run& run, Algorithm a, const Group& g, float* buf, float* residual, float* server, std::size_t count,
               float scale_by, Carve& wire_carve, Carve& local, Slots* keep, std::size_t unit_count) {
  const Wire w = flat_wire(run, a, g.size(), unit_count ? unit_count : count);
  if (a == Algorithm::Allgather)
    allgather(run, g, buf, residual, count, scale_by, w, wire_carve, keep);
  else
    scatter_reduce(run, g, buf, residual, server, count, scale_by, w, wire_carve, local,
                   a == Algorithm::ReduceScatter ? Half::ReduceOnly : Half::Both, keep);
}

void decode_kept(Run& run, Algorithm a, int members, const Wire& w, const Slots& kept, std::size_t count, float* buf,
                      float scale_by) {
  const auto N = static_cast<std::size_t>(members);
  Codec& kc = *w.kept(a);
  const std::size_t cap = kc.max_payload_bytes(w.seg);
  const std::size_t S = flat_segments(a, members, count, w);
  run.timer.begin();
  for (std::size_t s = 0; s < S; ++s) {
    if (a == Algorithm::Allgather) {  // allgather's sum of every member's payload
      const ChunkRange r = segment(count, w.seg, s);
      run.payload_refs.clear();
      for (std::size_t j = 0; j < N; ++j) run.payload_refs.push_back({kept.at(s, j), run.kept_size(kc, kept.at(s, j), r.count, cap)});
      kc.decode_sum(run.payload_refs, buf + r.offset, r.count, scale_by, run.exec);
    } else {  // scatter_reduce's gather: each chunk's payload into its place
      for (std::size_t j = 0; j < N; ++j) {
        const ChunkRange c = chunk_range(count, members, static_cast<int>(j), w.grain), r = segment(c.count, w.seg, s);
        const PayloadRef p{kept.at(s, j), run.kept_size(kc, kept.at(s, j), r.count, cap)};
        kc.decode_sum(std::span(&p, 1), buf + c.offset + r.offset, r.count, scale_by, run.exec);
      }
    }
  }
  run.timer.end(&run.stats.decode_s);
}

}  // namespace gz::detail

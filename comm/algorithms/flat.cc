// What the flat algorithms share and what hierarchical.cc runs them through:
// each algorithm's FlatPhase (its descriptor's `flat`, defined in its own
// file), looked up by id, so that nothing here names one.
#include "comm/algorithms/flat.h"

#include "common/error.h"

namespace gz::detail {

const FlatPhase& flat_phase(Algorithm a) {
  const AlgorithmDescriptor& d = algorithm_descriptor(a);
  if (!d.flat) GZ_THROW(InvalidArgument, "algorithm '", d.name, "' does not run as a phase over a group of ranks");
  return *d.flat;
}

std::size_t chunk_segments(int members, std::size_t count, const Wire& w) {
  return segment_count(chunk_range(count, members, 0, w.grain).count, w.seg);
}

Wire flat_wire(Run& run, Algorithm a, int members, std::size_t unit_count) {
  return flat_phase(a).wire(run, members, unit_count);
}

std::size_t flat_segments(Algorithm a, int members, std::size_t count, const Wire& w) {
  return flat_phase(a).segments(members, count, w);
}

void flat(Run& run, Algorithm a, const Group& g, float* buf, float* residual, float* server, std::size_t count,
          float scale_by, Carve& wire_carve, Carve& local, Slots* keep, std::size_t unit_count) {
  const FlatPhase& f = flat_phase(a);
  const Wire w = f.wire(run, g.size(), unit_count ? unit_count : count);
  f.run(run, g, buf, residual, server, count, scale_by, w, wire_carve, local, keep);
}

void decode_kept(Run& run, Algorithm a, int members, const Wire& w, const Slots& kept, std::size_t count, float* buf,
                 float scale_by) {
  const FlatPhase& f = flat_phase(a);
  GZ_ENFORCE(f.decode_kept != nullptr, "algorithm '", algorithm_descriptor(a).name, "' keeps no payloads");
  Codec& kc = *w.kept(a);
  const std::size_t cap = kc.max_payload_bytes(w.seg);
  const std::size_t S = f.segments(members, count, w);
  run.timer.begin();
  for (std::size_t s = 0; s < S; ++s) f.decode_kept(run, members, w, kept, s, count, buf, scale_by, kc, cap);
  run.timer.end(&run.stats.decode_s);
}

}  // namespace gz::detail

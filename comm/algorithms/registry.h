// The algorithm registry: every collective algorithm gradzip runs, one line
// each. The Algorithm enum is made from it (comm/engine/collective.h): a
// line's position is the algorithm's number, which saved error-feedback
// states hold, so lines are appended, never reordered:
//
//   X(enumerator, name)
//
//   - enumerator: Algorithm::<enumerator>.
//   - name: the descriptor's name, gz::algorithms::<name>, defined in
//     comm/algorithms/<name>.cc (algorithm.h); also its spelling in
//     parse_algorithm(), Python and the benchmarks.
//
// The engine, the error-feedback state, Python (gradzip.algorithms()) and
// the tests iterate over the descriptors. Adding an algorithm:
// docs/ARCHITECTURE.md, "Adding a collective algorithm".
#pragma once

#define GZ_ALGORITHM_REGISTRY(X) \
  X(Allgather, allgather)        \
  X(ScatterReduce, scatter_reduce) \
  X(Hierarchical, hierarchical)  \
  X(ReduceScatter, reduce_scatter) \
  X(Ring, ring)

namespace gz {

struct AlgorithmDescriptor;

namespace algorithms {
#define GZ_ALGORITHM_DESCRIPTOR(E, name) extern const AlgorithmDescriptor name;
GZ_ALGORITHM_REGISTRY(GZ_ALGORITHM_DESCRIPTOR)
#undef GZ_ALGORITHM_DESCRIPTOR
}  // namespace algorithms

}  // namespace gz

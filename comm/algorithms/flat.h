// The flat algorithms over one group of ranks (the world, or a node or a
// column of nodes in hierarchical), pipelined: allgather.cc and
// scatter_reduce.cc, and what hierarchical.cc runs them through. Internal
// to comm/algorithms/.
#pragma once

#include "comm/algorithms/algorithm.h"
#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce_run.h"

namespace gz::detail {

/// An algorithm as a phase over a group of ranks (its descriptor's `flat`):
/// what flat(), flat_wire(), flat_segments(), decode_kept() and hierarchical
/// ask of it, so that they name no algorithm.
struct FlatPhase {
  /// How it cuts a run of `unit_count` elements over `members` ranks.
  Wire (*wire)(Run& run, int members, std::size_t unit_count) = nullptr;
  /// Segments of a member's run of `count` elements cut as `w` says.
  std::size_t (*segments)(int members, std::size_t count, const Wire& w) = nullptr;
  /// Runs it over group g (flat()'s arguments).
  void (*run)(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count,
              float scale_by, const Wire& w, Carve& wire_carve, Carve& local, Slots* keep) = nullptr;
  /// Elements of the payload it kept for segment s of member j (of a run of `count`).
  std::size_t (*kept_count)(std::size_t count, int members, const Wire& w, std::size_t s, std::size_t j) = nullptr;
  /// Decodes segment s of what it kept (payloads of `kc`, each at most `cap`
  /// bytes) into buf, as its owner decoded it. Null: it keeps nothing.
  void (*decode_kept)(Run& run, int members, const Wire& w, const Slots& kept, std::size_t s, std::size_t count,
                      float* buf, float scale_by, Codec& kc, std::size_t cap) = nullptr;
  /// The cost model's time of the phase over group g.
  Prediction (*predict)(const CostInputs& in, const CostGroup& g, std::size_t count) = nullptr;
};

/// The flat phase of `a` (InvalidArgument when it has none).
const FlatPhase& flat_phase(Algorithm a);

/// Segments of a member's run of `count` elements cut into chunks (on runs
/// of w.grain) and then segments: the FlatPhase::segments of the chunked
/// phases (scatter_reduce, reduce_scatter).
std::size_t chunk_segments(int members, std::size_t count, const Wire& w);

/// Which halves of scatter_reduce a phase runs (hierarchical runs them apart).
enum class Half { Both, ReduceOnly, GatherOnly };

/// allgather over group g, on count elements of buf (residual: the worker
/// EF state of those elements). Takes its slots from `wire_carve`
/// (transport-visible memory). `keep` (hierarchical): the payloads of the
/// last step stay, segment s of member j at keep->at(s, j), to be passed to
/// the node after.
void allgather(Run& run, const Group& g, float* buf, float* residual, std::size_t count, float scale_by, Wire w,
               Carve& wire_carve, Slots* keep = nullptr);
/// scatter_reduce over group g (server: the server EF state of this
/// member's chunk; `local`: the chunk sums). Half::ReduceOnly leaves member
/// j with the sum of chunk j (times scale) in place; Half::GatherOnly then
/// gives every member every chunk.
void scatter_reduce(Run& run, const Group& g, float* buf, float* residual, float* server, std::size_t count,
                    float scale_by, Wire w, Carve& wire_carve, Carve& local, Half half = Half::Both,
                    Slots* keep = nullptr);
/// The flat algorithm `a` over group g (its descriptor's FlatPhase).
/// Segments and codec are chosen for `unit_count` elements (0: count): the
/// same for every shard of a node in hierarchical.
void flat(Run& run, Algorithm a, const Group& g, float* buf, float* residual, float* server, std::size_t count,
          float scale_by, Carve& wire_carve, Carve& local, Slots* keep = nullptr, std::size_t unit_count = 0);
/// How `a` over `members` ranks cuts `unit_count` elements (flat's choice).
Wire flat_wire(Run& run, Algorithm a, int members, std::size_t unit_count);
/// Segments of a member's run of `count` elements under `a` cut as `w` says (flat's).
std::size_t flat_segments(Algorithm a, int members, std::size_t count, const Wire& w);
/// Decodes what flat kept of a run of `count` elements into buf (as its
/// owner decoded it): `kept` holds flat_segments sets of `members` payloads.
void decode_kept(Run& run, Algorithm a, int members, const Wire& w, const Slots& kept, std::size_t count, float* buf,
                 float scale);

}  // namespace gz::detail

// A collective algorithm's descriptor: what the engine, the error-feedback
// state, Python and a cost model need to know about one algorithm, declared
// once, in its comm/algorithms/<algorithm>.cc (as a codec's in
// compressors/<codec>.cc), plus one line in comm/algorithms/registry.h:
//
//   extern const AlgorithmDescriptor allgather{
//       .name = "allgather", .id = Algorithm::Allgather, .summary = "...",
//       .run = run, .residual_counts = residuals, .wire_bytes = bytes, .steps = steps};
//
// The engine (comm/engine/) does what every algorithm shares: checks, the
// agreement, the state, the workspace, segments and flights (detail::Run);
// the descriptor's run() lays out its slots and moves the bytes.
// Adding an algorithm: docs/ARCHITECTURE.md, "Adding a collective algorithm".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "comm/engine/collective.h"
#include "comm/engine/topology.h"
#include "compressors/spec.h"

namespace gz {

/// Chunk j of a buffer of n elements split over `ranks` ranks: the first
/// n % ranks chunks have one element more. Empty chunks are fine (n < ranks).
struct ChunkRange {
  std::size_t offset = 0;
  std::size_t count = 0;
};
ChunkRange chunk_range(std::size_t n, int ranks, int j);
/// Chunk j when chunks are cut on whole runs of `grain` elements: the
/// ceil(n / grain) runs split over the ranks as chunk_range splits elements
/// (the first ones get a run more), the last run short when grain does not
/// divide n. grain 1 is chunk_range. scatter_reduce cuts on its codec's
/// blocks (chunk_grain) so that no block is split between two chunks: its
/// payloads then hold the blocks and sign words of one payload of the whole
/// buffer, not a partial block more per chunk.
ChunkRange chunk_range(std::size_t n, int ranks, int j, std::size_t grain);
/// The elements scatter_reduce's chunks of a run of n elements over `ranks`
/// ranks are cut on for `codec`: its descriptor's segment granule (onebit,
/// fp8, qsgd: the block) when the run holds at least kChunkGrainRuns of
/// them per rank, else 1. Whole blocks make the chunks differ by up to a
/// block, and the rank with the longer chunk sends its sum to P-1 ranks:
/// with at least 16 blocks per rank that costs it at most ~3% more than
/// the others, where a small buffer would leave some ranks no chunk at all.
/// reduce_scatter() and hierarchical's shards keep chunk_range (grain 1).
inline constexpr std::uint64_t kChunkGrainRuns = 16;
std::size_t chunk_grain(const CodecConfig& codec, std::uint64_t n, int ranks);

class WorkspaceCarver;
namespace detail {
struct Run;
struct FlatPhase;
}  // namespace detail
struct CostInputs;  // comm/cost/cost_model.h
struct Prediction;

/// One call as a cost formula sees it: the codec (and scatter_reduce's
/// server codec), the buffer, the ranks and their nodes.
struct CostQuery {
  CodecConfig codec;
  CodecConfig server;       ///< the chunk sums' codec (server_codec_config(codec) unless given)
  std::uint64_t n = 0;      ///< elements
  int rank = 0;             ///< whose bytes (ranks may differ by a chunk's element)
  const Topology* topology = nullptr;  ///< the ranks' nodes; its ranks() is the world size
};

/// What one rank sends in one call, and how many rounds it waits for.
struct WireCost {
  /// Payload bytes this rank sends to other ranks, each payload of the
  /// codec's size for its whole run (one per chunk or buffer, payload_bytes:
  /// a fixed-size codec's body); the pipeline adds, per extra segment, the
  /// blocks it splits and (top-k) one header (32 bytes). Codec none on the
  /// host counts its floats (4 bytes each).
  double bytes = 0;
  /// The part of `bytes` that goes to ranks on other nodes.
  double remote_bytes = 0;
  /// Messages this rank sends (unsegmented: one per payload and peer).
  std::uint64_t messages = 0;
  /// Rounds that follow one another (each waits for the one before): a
  /// time model's latency term is rounds x (link latency); segments overlap
  /// the rounds of one another.
  int rounds = 0;
};

struct AlgorithmDescriptor {
  std::string_view name;  ///< as parse_algorithm() takes it
  Algorithm id = Algorithm::Auto;
  std::string_view summary;  ///< one line (help texts, docs)
  /// An allreduce algorithm (AllreduceOptions::algorithm); false: a
  /// collective of its own (reduce_scatter).
  bool allreduce = true;
  /// Lays its work out by the ranks' nodes and needs the same number of
  /// ranks on every node (hierarchical): its residuals and its agreement
  /// depend on the topology, which a saved state does not hold.
  bool follows_nodes = false;
  /// Its result is what the server codec's payloads decode to (the chunk
  /// sums re-encoded: scatter_reduce): a caller that keeps its payloads
  /// (hierarchical, across nodes) decodes them with the server codec.
  bool server_phase = false;
  /// The first ErrorFeedback save format that holds its state (the
  /// algorithm's byte in a saved state: error_feedback.cc).
  std::uint8_t state_version = 2;
  /// Runs the call on the engine's prepared Run: lays out its slots from
  /// `wire` (transport-visible memory) and `local` (sums), and with a
  /// sizing (null-based) carver returns right after.
  void (*run)(detail::Run& run, WorkspaceCarver& wire, WorkspaceCarver& local) = nullptr;
  /// Residual floats of this rank's error-feedback state (worker, server)
  /// for a call of n elements (codec.ef; else the engine allocates none).
  std::pair<std::uint64_t, std::uint64_t> (*residual_counts)(const CodecConfig& codec, std::uint64_t n, int rank,
                                                             const Topology& topology) = nullptr;
  /// The bytes and rounds of one call (cost models, tests, gradzip.algorithms()).
  WireCost (*wire_cost)(const CostQuery& q) = nullptr;

  // -- auto (resolve_algorithm, comm/cost/auto_choice.h) ----------------------
  /// Whether Auto may run it for `codec` on ranks of this shape (null: never).
  bool (*auto_candidate)(const CodecConfig& codec, const TopologyShape& shape) = nullptr;
  /// Auto without a link model runs the candidate of the highest priority,
  /// then of the fewest auto_bytes, then the first in the registry.
  int auto_priority = 0;
  /// Bytes per element one rank sends, for a codec of c and a server codec
  /// of s payload bytes per element on `ranks` ranks (auto's rule by bytes).
  double (*auto_bytes)(double c, double s, int ranks) = nullptr;

  // -- time (comm/cost/cost_model.h) --------------------------------------------
  /// The cost model's time of one call (null: none; auto by the model skips it).
  Prediction (*predict)(const CostInputs& in) = nullptr;
  /// Bytes of memory one rank's codec work touches in one call, and the bytes
  /// it sends to each peer: the call's memory-traffic and link limit
  /// (memory_limit). Null: no limit.
  double (*memory_bytes)(const CostInputs& in) = nullptr;
  double (*bytes_per_peer)(const CostInputs& in) = nullptr;

  /// How it runs as one phase over a group of ranks (comm/algorithms/flat.h:
  /// hierarchical runs the algorithm auto picks for its nodes across them,
  /// through this); null when it cannot (hierarchical, ring).
  const detail::FlatPhase* flat = nullptr;
};

/// Every algorithm, in Algorithm enum order (Auto aside).
std::span<const AlgorithmDescriptor* const> all_algorithms();
/// The algorithm with this name or id, or nullptr (Auto has none).
const AlgorithmDescriptor* find_algorithm(std::string_view name);
const AlgorithmDescriptor* find_algorithm(Algorithm id);
/// The descriptor of `id`; InvalidArgument for Auto or an unknown id.
const AlgorithmDescriptor& algorithm_descriptor(Algorithm id);
/// What hierarchical runs across `nodes` nodes: auto's rule for that many
/// ranks among the algorithms that run as a phase over a group (a `flat`
/// phase; the ring has none).
Algorithm inner_algorithm(const CodecConfig& codec, int nodes);

/// Payload bytes of `count` elements of `codec` as an algorithm moves them
/// over a transport of host memory (0 for 0 elements): raw floats for a
/// lossless codec; the body alone for a fixed-size codec (its header is
/// the call's agreement: the receiver writes it, Run::arrived); else the
/// whole payload. A transport of device memory (NCCL) adds the 32-byte
/// header to each fixed-size payload.
double payload_bytes(const CodecConfig& codec, std::uint64_t count);

}  // namespace gz

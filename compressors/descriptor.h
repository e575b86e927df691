// A codec's descriptor: everything gradzip needs to know about a codec besides
// its math, declared once, in its compressors/<codec>.cc:
//
//   extern const CodecDescriptor fp8{
//       .name = "fp8", .id = CodecId::Fp8, .summary = "...",
//       .keys = kKeys, .make = make, .error_bound = bound, ...};
//
// plus one line in registry.h. Spec parsing and canonical forms (spec.cc),
// make_codec, the allreduce's algorithm choice, payload-size rule and error
// bound (comm/), the Python bindings, the sweep, the benchmarks and the generic
// tests all iterate over all_codecs() instead of naming codecs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "compressors/spec.h"

namespace gz {

class Codec;

/// One key of a spec string (ef aside, which every codec takes).
struct CodecKey {
  enum class Kind : std::uint8_t {
    Integer,  ///< a whole number in [lo, hi] (hi <= 2^53: values are kept as doubles)
    Real,     ///< a number in (lo, hi]
    Choice,   ///< one of `choices`; the value is its index
  };
  std::string_view name;
  Kind kind = Kind::Integer;
  double fallback = 0;  ///< the default (Choice: the default's index)
  double lo = 0, hi = 0;
  /// The range as messages state it: "in [1, 2^30]" -> "block must be in [1, 2^30], got 0".
  std::string_view range = {};
  std::span<const std::string_view> choices = {};
  /// The canonical form names the key even at its default (onebit:block=512).
  bool always_shown = false;
};

/// How the allreduce should move this codec's payloads.
struct AlgorithmHint {
  /// Payloads list selected entries (index, value): decode touches only those,
  /// and a sum of several payloads is denser than each one.
  bool sparse = false;
  /// Ranks up to which allgather beats scatter_reduce. Sparse payloads prefer
  /// it longer: scatter_reduce re-encodes each chunk's sum, which loses what
  /// the other ranks sent and spends a second compression.
  int allgather_up_to_ranks = 2;
};

/// A benchmark row: the label in benchmark names and tables, and the spec.
struct BenchSpec {
  std::string_view label;
  std::string_view spec;
};

struct CodecDescriptor {
  std::string_view name;  ///< the spec name (a string literal: name.data() is null-terminated)
  CodecId id = CodecId::None;
  std::string_view summary;  ///< what a payload holds, one line (help texts, docs)
  std::span<const CodecKey> keys = {};
  /// Sends the exact values: error feedback does not apply (off, and ef=on is rejected).
  bool lossless = false;
  std::unique_ptr<Codec> (*make)(const CodecConfig&) = nullptr;
  /// Whether every payload of n elements is exactly Codec::max_payload_bytes(n)
  /// bytes (the header param then always equals Codec::header_param(n)).
  /// nullptr: always. Otherwise the size varies per call, up to that bound.
  bool (*fixed_size)(const CodecConfig&) = nullptr;
  /// The documented bound on the relative L2 error of one compressed allreduce
  /// against the exact sum (gradzip-bench checks every row against it).
  double (*error_bound)(const CodecConfig&) = nullptr;
  AlgorithmHint hint = {};
  /// The spec scatter_reduce re-encodes the chunk sums with (its second,
  /// "server" phase), when not the codec itself: a chunk sum is compressed
  /// once for every rank, so its error is not averaged over the ranks as the
  /// first phase's is (comm/engine/allreduce.h, server_codec_config). Empty: itself.
  std::string_view server_spec = {};
  /// Segments of a pipelined allreduce hold a whole multiple of this many
  /// elements, so that segmenting changes no bit (onebit: its block).
  /// nullptr: any length.
  std::uint64_t (*segment_granule)(const CodecConfig&) = nullptr;
  /// The config each segment of a run of n elements encodes with, when it is
  /// not cfg itself (top-k with k=K: every segment keeps the share K / n);
  /// false: cfg as it is. nullptr: always cfg.
  bool (*segment_config)(const CodecConfig& cfg, std::uint64_t n, CodecConfig* out) = nullptr;
  /// Words a header param the layout's check_param rejected with `reason`.
  std::string (*describe_param)(std::uint32_t reason, std::uint32_t param, std::uint64_t count) = nullptr;
  /// Checks across keys after parsing (bit i of `given`: key i was in the
  /// spec); throws InvalidArgument. nullptr: none.
  void (*check)(std::string_view spec, const CodecConfig& cfg, std::uint32_t given) = nullptr;
  /// Whether the canonical form names key i; nullptr: always_shown, or when
  /// it differs from its default.
  bool (*shows)(const CodecConfig& cfg, std::size_t key) = nullptr;
  /// Specs that reach every path of this codec (block sizes, tails, options,
  /// ef=off): the generic tests and the fuzz seeds run each of them.
  std::span<const std::string_view> test_specs = {};
  /// Benchmark rows; the first is the codec's entry in gradzip-bench's and the
  /// sweep's default lists.
  std::span<const BenchSpec> bench_specs = {};
};

/// Every codec, in wire id order.
std::span<const CodecDescriptor* const> all_codecs();
/// The codec with spec name `name`, or nullptr.
const CodecDescriptor* find_codec(std::string_view name);
/// The codec with wire id `id`, or nullptr.
const CodecDescriptor* find_codec(CodecId id);

/// Whether the allreduce's auto choice is allgather for this codec on `ranks`
/// ranks (2 ranks or fewer: always; more: up to the codec's hint).
inline bool prefers_allgather(const CodecDescriptor& d, int ranks) {
  return ranks <= 2 || ranks <= d.hint.allgather_up_to_ranks;
}

/// Whether every payload of this config has the same size for the same n.
inline bool payload_size_fixed(const CodecConfig& c) {
  const CodecDescriptor& d = c.descriptor();
  return d.fixed_size == nullptr || d.fixed_size(c);
}

/// The descriptor's error bound (0 when it declares none).
inline double error_bound(const CodecConfig& c) {
  const CodecDescriptor& d = c.descriptor();
  return d.error_bound ? d.error_bound(c) : 0.0;
}

}  // namespace gz

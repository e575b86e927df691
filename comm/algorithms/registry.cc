// The descriptors of every algorithm (registry.h's list), and what the
// cost formulas share.
#include "comm/algorithms/registry.h"

#include <algorithm>

#include "comm/algorithms/algorithm.h"
#include "comm/engine/allreduce.h"
#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"

namespace gz {

std::span<const AlgorithmDescriptor* const> all_algorithms() {
  static constexpr const AlgorithmDescriptor* kAll[] = {
#define GZ_ALGORITHM_ADDRESS(E, name) &algorithms::name,
      GZ_ALGORITHM_REGISTRY(GZ_ALGORITHM_ADDRESS)
#undef GZ_ALGORITHM_ADDRESS
  };
  return kAll;
}

const AlgorithmDescriptor* find_algorithm(std::string_view name) {
  for (const AlgorithmDescriptor* d : all_algorithms())
    if (d->name == name) return d;
  return nullptr;
}

const AlgorithmDescriptor* find_algorithm(Algorithm id) {
  for (const AlgorithmDescriptor* d : all_algorithms())
    if (d->id == id) return d;
  return nullptr;
}

const AlgorithmDescriptor& algorithm_descriptor(Algorithm id) {
  const AlgorithmDescriptor* d = find_algorithm(id);
  if (!d) GZ_THROW(InvalidArgument, "no algorithm descriptor for '", to_string(id), "' (auto resolves to one first)");
  return *d;
}

Algorithm inner_algorithm(const CodecConfig& codec, int nodes) {
  return resolve_algorithm(Algorithm::Auto, codec, TopologyShape::flat(nodes), nullptr,
                           [](const AlgorithmDescriptor& d) { return d.flat != nullptr; });
}

ChunkRange chunk_range(std::size_t n, int ranks, int j) {
  const auto P = static_cast<std::size_t>(ranks), J = static_cast<std::size_t>(j);
  const std::size_t base = n / P, extra = n % P;
  return {J * base + (J < extra ? J : extra), base + (J < extra ? 1 : 0)};
}

ChunkRange chunk_range(std::size_t n, int ranks, int j, std::size_t grain) {
  if (grain <= 1) return chunk_range(n, ranks, j);
  const ChunkRange runs = chunk_range((n + grain - 1) / grain, ranks, j);  // in runs of grain
  const std::size_t offset = std::min(n, runs.offset * grain);
  return {offset, std::min(n, (runs.offset + runs.count) * grain) - offset};
}

std::size_t chunk_grain(const CodecConfig& codec, std::uint64_t n, int ranks) {
  const auto granule = codec.descriptor().segment_granule;
  const std::uint64_t g = granule ? std::max<std::uint64_t>(1, granule(codec)) : 1;
  return n / g >= kChunkGrainRuns * static_cast<std::uint64_t>(std::max(ranks, 1)) ? static_cast<std::size_t>(g) : 1;
}

double payload_bytes(const CodecConfig& codec, std::uint64_t count) {
  if (count == 0) return 0;
  if (codec.descriptor().lossless) return 4.0 * static_cast<double>(count);
  const std::size_t bytes = make_codec(codec)->max_payload_bytes(count);
  return static_cast<double>(payload_size_fixed(codec) ? bytes - wire::kHeaderBytes : bytes);
}

}  // namespace gz

// Shared pieces of the kernel benchmarks: sizes, inputs, and the names that
// the ratio summary (main.cc) looks up.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compressors/descriptor.h"

namespace gz::bench {

/// Element counts every benchmark runs: 1M, 16M, 64M floats.
inline const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> s = {std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20};
  return s;
}

/// A codec spec benchmarked, by the short name used in benchmark names.
struct BenchCodec {
  std::string name;
  std::string spec;
  const CodecDescriptor* codec;
  /// Dense and lossy: held to the kernel targets (share of copy's rate).
  bool targeted() const { return !codec->lossless && !codec->hint.sparse; }
};

/// Every registered codec's benchmark rows (descriptor.h: bench_specs).
inline const std::vector<BenchCodec>& bench_codecs() {
  static const std::vector<BenchCodec> c = [] {
    std::vector<BenchCodec> out;
    for (const CodecDescriptor* d : all_codecs())
      for (const BenchSpec& b : d->bench_specs) out.push_back({std::string(b.label), std::string(b.spec), d});
    return out;
  }();
  return c;
}

inline std::vector<float> random_normal(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::string size_name(std::size_t n) { return std::to_string(n); }

/// Sets both counters the summary reads: elements/s and bytes/s.
inline void set_rates(benchmark::State& state, std::size_t n, std::size_t bytes_moved) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes_moved));
}

}  // namespace gz::bench

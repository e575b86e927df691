// Helpers shared by the codec tests: seeded inputs, edge values, encode/decode
// round trips through the public Codec interface.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compressors/codec.h"

namespace gz::test {

/// Every codec spec the suite runs over (each with and without error feedback where it applies).
inline const std::vector<const char*>& all_specs() {
  static const std::vector<const char*> specs = {
      "none", "fp16", "bf16", "onebit:block=512", "onebit:block=100", "onebit:block=1",
      "topk:density=0.01", "topk:k=7", "topk:density=0.3,select=sample", "fp16:ef=off", "onebit:block=64,ef=off",
      "topk:density=0.05,ef=off"};
  return specs;
}

inline std::vector<float> normal(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Values the codecs must treat with care.
inline std::vector<float> edge_values() {
  using L = std::numeric_limits<float>;
  return {0.0f,         -0.0f,       L::denorm_min(), -L::denorm_min(), 1e-40f,  -3e-39f,
          L::min(),     -L::min(),   1.0f,            -1.0f,            65504.0f, 65519.0f,
          65520.0f,     -70000.0f,   1e6f,            -1e30f,           L::max(), -L::max(),
          5.96e-8f,     2.98e-8f,    2.9802322e-8f,   6.1035156e-5f,    0.1f,     -0.33333334f};
}

/// A buffer holding one encoded payload, aligned for the codec.
struct Encoded {
  std::vector<std::uint64_t> storage;  // 8-byte aligned backing store
  std::size_t bytes = 0;
  std::byte* data() { return reinterpret_cast<std::byte*>(storage.data()); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(storage.data()); }
};

inline Encoded encode(Codec& codec, const std::vector<float>& g, std::vector<float>* residual) {
  Encoded e;
  const std::size_t cap = codec.max_payload_bytes(g.size());
  e.storage.assign(cap / 8 + 1, 0);
  e.bytes = codec.encode(g.data(), residual ? residual->data() : nullptr, g.size(), e.data(), cap);
  return e;
}

inline std::vector<float> decode(Codec& codec, const Encoded& e, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  codec.decode_accumulate(e.data(), e.bytes, out.data(), n);
  return out;
}

/// Bitwise equality that treats every NaN as equal to every NaN.
inline bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace gz::test

// Deterministic inputs and reference results for the allreduce tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/engine/allreduce.h"
#include "common/fingerprint.h"
#include "compressors/spec.h"

namespace gz::test {

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Rank r's gradient at step `step`: integers in [-64, 64] when `integer`
/// (sums are exact in fp32), else a per-element bias plus noise in [-1, 1).
inline std::vector<float> make_input(int rank, std::size_t n, int step = 0, bool integer = false) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = mix((std::uint64_t(rank) << 48) ^ (std::uint64_t(step) << 32) ^ i);
    if (integer) {
      v[i] = static_cast<float>(static_cast<int>(h % 129) - 64);
    } else {
      const double noise = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;
      const double bias = std::sin(0.37 * static_cast<double>(i)) * 0.5;
      v[i] = static_cast<float>(bias + noise);
    }
  }
  return v;
}

/// The exact sum over ranks, in double.
inline std::vector<double> exact_sum(int ranks, std::size_t n, int step = 0, bool integer = false) {
  std::vector<double> s(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const auto v = make_input(r, n, step, integer);
    for (std::size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

/// ||out - exact|| / ||exact|| (0 when both are empty or zero).
template <class T>
double rel_error(const std::vector<T>& out, const std::vector<double>& exact) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const double d = static_cast<double>(out[i]) - exact[i];
    num += d * d;
    den += exact[i] * exact[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace gz::test

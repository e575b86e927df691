// Per-element math of exact top-k by magnitude.
//
// Order: larger |v| first; equal magnitudes are broken by the lower index.
// Magnitudes compare as the integer bits of |v| (sign bit cleared), which for
// IEEE floats orders exactly like the values, puts +inf above every finite
// value and NaN above inf, so NaN gradients are always sent (and seen).
// The K selected (index, value) pairs travel in increasing index order.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace gz::kernels {

/// Radix key of an element: the bits of |v|. 31 significant bits.
GZ_HD std::uint32_t topk_key(float v) { return float_bits(v) & 0x7FFFFFFFu; }

/// Radix-select digits over the 31-bit key: bits 30..20, 19..9, 8..0.
inline constexpr int kTopkDigits = 3;
inline constexpr int kTopkDigitShift[kTopkDigits] = {20, 9, 0};
inline constexpr int kTopkDigitBits[kTopkDigits] = {11, 11, 9};

GZ_HD std::uint32_t topk_digit(std::uint32_t key, int d) {
  return (key >> kTopkDigitShift[d]) & ((1u << kTopkDigitBits[d]) - 1u);
}

/// Entries K for `n` elements at `density` (0 < density <= 1): ceil(density * n),
/// at least 1 when n > 0, with a tolerance so that 0.01 * 100 gives 1, not 2.
GZ_HD std::uint64_t topk_k_for_density(std::uint64_t n, double density) {
  if (n == 0) return 0;
  const double x = density * static_cast<double>(n);
  std::uint64_t k = static_cast<std::uint64_t>(x);
  if (x - static_cast<double>(k) > 1e-9 * (x > 1.0 ? x : 1.0)) ++k;
  if (k < 1) k = 1;
  return k > n ? n : k;
}

/// Where the K-th largest key lies: every key above `threshold` is selected,
/// plus the first `ties` keys equal to it in index order.
struct TopkThreshold {
  std::uint32_t threshold = 0;
  std::uint64_t ties = 0;
};

}  // namespace gz::kernels

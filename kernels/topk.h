// Per-element math of exact top-k by magnitude.
//
// Order: larger |v| first; equal magnitudes are broken by the lower index.
// Magnitudes compare as the integer bits of |v| (sign bit cleared), which for
// IEEE floats orders exactly like the values, puts +inf above every finite
// value and NaN above inf, so NaN gradients are always sent (and seen). Every
// NaN gets the same key: GPU arithmetic returns one canonical NaN where x86
// keeps the operand's payload, and ranking NaNs by payload bits would make the
// two pick different NaNs when more than K elements are NaN.
// The K selected (index, value) pairs travel in increasing index order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/hd.h"

namespace gz::kernels {

/// Radix key of an element: the bits of |v|, all NaNs mapped to 0x7FFFFFFF. 31 significant bits.
GZ_HD std::uint32_t topk_key(float v) {
  const std::uint32_t a = float_bits(v) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? 0x7FFFFFFFu : a;
}

/// Radix-select digits over the 31-bit key: bits 30..20, 19..9, 8..0.
inline constexpr int kTopkDigits = 3;
inline constexpr int kTopkDigitShift[kTopkDigits] = {20, 9, 0};
inline constexpr int kTopkDigitBits[kTopkDigits] = {11, 11, 9};

GZ_HD std::uint32_t topk_digit(std::uint32_t key, int d) {
  return (key >> kTopkDigitShift[d]) & ((1u << kTopkDigitBits[d]) - 1u);
}

/// Wire body (header param = K, the entries in this payload):
///   K x u32 index (strictly increasing, < n), then K x f32 value.
struct TopkLayout {
  /// Indices are u32: a topk payload covers at most this many elements.
  static constexpr std::uint64_t kMaxCount = 0xFFFFFFFFu;
  /// 0 when a header param is valid for `count` elements; 1: count over kMaxCount; 2: K > count.
  GZ_HD static std::uint32_t check_param(std::uint32_t k, std::uint64_t count) {
    if (count > kMaxCount) return 1;
    return k > count ? 2u : 0u;
  }
  /// Offset of the values.
  GZ_HD static std::uint64_t values_offset(std::uint32_t k) { return 4 * static_cast<std::uint64_t>(k); }
  GZ_HD static std::uint64_t body_bytes(std::uint32_t k, std::uint64_t) { return 8 * static_cast<std::uint64_t>(k); }
};

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

// ---- Candidate bound from a sample (the CPU loop and the CUDA launch share it,
// so both pick the same candidates and, with select=sample, send the same set).
// kTopkSample keys at fixed, evenly spaced positions give a lower bound L that,
// with high probability, at least K keys reach and not many more.

inline constexpr std::uint64_t kTopkSample = 16384;
/// Below this many elements the selection runs over the whole array.
inline constexpr std::uint64_t kTopkDirectBelow = 4 * kTopkSample;

/// Position of sample j (0 <= j < kTopkSample) in an array of n elements.
GZ_HD std::uint64_t topk_sample_position(std::uint64_t j, std::uint64_t n) { return j * n / kTopkSample; }

/// Candidates (key >= L) a workspace holds; more than this falls back to the whole array.
GZ_HD std::uint64_t topk_candidate_capacity(std::uint64_t n, std::uint64_t k) {
  const std::uint64_t cap = 2 * k + n / 64 + 4096;
  return cap < n ? cap : n;
}

/// Rank, within the sample, of the key used as the bound L: the expected
/// number of sample keys among the top K (sampled: exactly that, rounded),
/// plus a 4-sigma margin (exact: so that L rarely leaves fewer than K
/// candidates). 0 means "no sample": select over the whole array (k == 0,
/// k >= n, small n, or a rank the sample cannot resolve).
inline std::uint64_t topk_sample_rank(std::uint64_t n, std::uint64_t k, bool sampled) {
  if (k == 0 || k >= n || n < kTopkDirectBelow) return 0;
  const double hits = static_cast<double>(k) * static_cast<double>(kTopkSample) / static_cast<double>(n);
  const double rank = sampled ? std::max(1.0, std::round(hits)) : std::ceil(hits + 4.0 * std::sqrt(hits) + 16.0);
  return rank >= static_cast<double>(kTopkSample) ? 0 : static_cast<std::uint64_t>(rank);
}

}  // namespace gz::kernels

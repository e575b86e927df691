// Per-element math of 1-bit SGD (Seide et al. 2014) with per-block scales.
//
// Each block of B consecutive elements sends one sign bit per element plus two
// reconstruction values: the mean of its non-negative inputs and the mean of
// its negative inputs. Decoding a bit gives its block's matching mean.
//
// The block means are sums in a fixed order so that every implementation (CPU
// loop, CUDA warp) produces the same bits:
//   - 32 lanes: lane l accumulates, in double and in increasing index order,
//     the elements whose position within the block is congruent to l mod 32;
//   - then a halving tree: for off = 16, 8, 4, 2, 1: s[l] = s[l] + s[l + off].
// That is what a warp computes with __shfl_down_sync, and what the CPU loop
// computes with 32-wide vector accumulators.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace gz::kernels {

inline constexpr int kOnebitLanes = 32;
inline constexpr std::uint32_t kOnebitDefaultBlock = 512;

/// Reconstruction values of one block, as they travel on the wire.
struct OnebitScales {
  float pos;  ///< mean of the non-negative inputs (0 when there are none)
  float neg;  ///< mean of the negative inputs (0 when there are none)
};

/// Sign bit of an input: 1 for negative. -0 and NaN count as non-negative.
GZ_HD bool onebit_is_negative(float v) { return v < 0.0f; }

/// Per-lane partial sums of a block, combined in the fixed tree order.
struct OnebitPartial {
  double pos_sum = 0.0;
  double neg_sum = 0.0;
  std::uint32_t neg_count = 0;

  // Branch-free so it vectorizes; adding +0.0 to the other sum never changes it
  // (neither sum can be -0.0: the negative sum only takes values < 0).
  GZ_HD void add(float v) {
    const bool neg = onebit_is_negative(v);
    const double x = static_cast<double>(v);
    pos_sum += keep_if(!neg, x);
    neg_sum += keep_if(neg, x);
    neg_count += static_cast<std::uint32_t>(neg);
  }
  GZ_HD void merge(const OnebitPartial& o) {
    pos_sum += o.pos_sum;
    neg_sum += o.neg_sum;
    neg_count += o.neg_count;
  }
};

/// Block means from the tree-reduced sums; `len` is the block's element count.
GZ_HD OnebitScales onebit_scales(const OnebitPartial& total, std::uint32_t len) {
  const std::uint32_t pos_count = len - total.neg_count;
  OnebitScales s;
  s.pos = pos_count ? static_cast<float>(total.pos_sum / static_cast<double>(pos_count)) : 0.0f;
  s.neg = total.neg_count ? static_cast<float>(total.neg_sum / static_cast<double>(total.neg_count)) : 0.0f;
  return s;
}

/// The value an element decodes to.
GZ_HD float onebit_value(bool negative, OnebitScales s) { return select(negative, s.neg, s.pos); }

/// Number of blocks and of 32-bit sign words for n elements.
GZ_HD std::uint64_t onebit_blocks(std::uint64_t n, std::uint32_t block) { return (n + block - 1) / block; }
GZ_HD std::uint64_t onebit_words(std::uint64_t n) { return (n + 31) / 32; }

/// Wire body (header param = block size B >= 1):
///   ceil(n/B) x {f32 pos, f32 neg}, then ceil(n/32) x u32 sign words
///   (bit j of word w is element 32w+j; 1 = negative).
struct OnebitLayout {
  /// 0 when a header param is valid; 1: block size 0.
  GZ_HD static std::uint32_t check_param(std::uint32_t block, std::uint64_t) { return block == 0 ? 1u : 0u; }
  /// Offset of the sign words.
  GZ_HD static std::uint64_t words_offset(std::uint32_t block, std::uint64_t count) {
    return 8 * onebit_blocks(count, block);
  }
  GZ_HD static std::uint64_t body_bytes(std::uint32_t block, std::uint64_t count) {
    return words_offset(block, count) + 4 * onebit_words(count);
  }
};

}  // namespace gz::kernels

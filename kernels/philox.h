// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011): a counter-based generator. The same (key, counter) gives the same
// four 32-bit words on the host and on the device, in any order and on any
// thread, so a random draw is a pure function of what it is for.
//
// gradzip keys it with (seed, step) and counts elements in groups of 32: the
// group of elements 32g .. 32g+31 takes the four words of blocks 8g .. 8g+7,
// element 32g + 8k + l drawing word k of block 8g + l (philox_uniform). So
// eight consecutive elements draw one word of eight consecutive blocks: what
// eight SIMD lanes computing eight blocks at once hold, in element order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace gz::kernels {

struct Philox4 {
  std::uint32_t w[4];
};

namespace detail {
inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

GZ_HD std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
}
}  // namespace detail

/// Ten rounds of Philox4x32 on counter `c` with key (k0, k1).
GZ_HD Philox4 philox4x32_10(Philox4 c, std::uint32_t k0, std::uint32_t k1) {
  using namespace detail;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t hi0 = mulhi32(kPhiloxM0, c.w[0]), lo0 = kPhiloxM0 * c.w[0];
    const std::uint32_t hi1 = mulhi32(kPhiloxM1, c.w[2]), lo1 = kPhiloxM1 * c.w[2];
    c = Philox4{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

/// The second key word ("gzdz"): keeps seed 0 off the all-zero key.
inline constexpr std::uint32_t kPhiloxKey1 = 0x6772647Au;

/// Block `block` of four draws at (seed, step): counter (block, step) as four
/// 32-bit words, low first; key (seed, kPhiloxKey1).
GZ_HD Philox4 philox_block(std::uint32_t seed, std::uint64_t step, std::uint64_t block) {
  const Philox4 counter{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                         static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)}};
  return philox4x32_10(counter, seed, kPhiloxKey1);
}

/// A 32-bit draw as a float in [0, 1): its top 24 bits times 2^-24 (exact).
GZ_HD float uniform_from_bits(std::uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1p-24f; }

/// The uniform draw of element i at (seed, step): word (i % 32) / 8 of block
/// 8 (i / 32) + i % 8.
GZ_HD float philox_uniform(std::uint32_t seed, std::uint64_t step, std::uint64_t i) {
  const unsigned j = static_cast<unsigned>(i % 32);
  return uniform_from_bits(philox_block(seed, step, i / 32 * 8 + j % 8).w[j / 8]);
}

/// Elements per group: the draws of a group are the four words of eight blocks.
inline constexpr std::size_t kPhiloxGroup = 32;

namespace cpu {
/// philox_uniform for whole groups, on SIMD lanes where the CPU has them
/// (kernels/philox_cpu.cc): out[32 (g - first) + j] = philox_uniform(seed,
/// step, 32 g + j) for the groups g in [first, first + groups), j < 32.
void philox_uniforms(std::uint32_t seed, std::uint64_t step, std::uint64_t first, std::size_t groups, float* out);
}  // namespace cpu

}  // namespace gz::kernels

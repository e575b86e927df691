// cpu::philox_uniforms: Philox4x32-10 (kernels/philox.h) for whole groups of
// 32 draws, eight blocks per group on SIMD lanes, bit for bit philox_block.
//
// Lanes: a block's words sit in the low halves of 64-bit lanes, so one
// mul_epu32 gives a word's full 32x32->64 product in place (lo in the low
// half, hi one 64-bit shift away) and the high halves are never read. A round
// is then two multiplies, two shifts and two three-way XORs per lane vector,
// with no blends between the halves of a product. Two groups run interleaved:
// a round's multiply -> shift -> XOR chain is latency, not throughput, bound.
//   AVX-512: one vector of 8 blocks per word (a group), XORs as vpternlogd.
//   AVX2:    two vectors per word (even and odd blocks of a group).
// tests/codecs/qsgd_test.cc (Philox.LaneDrawsAreTheScalarDraws) checks them against philox_uniform.
#include "kernels/cpu_loops.h"  // the ISA macros and <immintrin.h>
#include "kernels/philox.h"

namespace gz::kernels::cpu {
namespace {

using kernels::detail::kPhiloxM0;
using kernels::detail::kPhiloxM1;
using kernels::detail::kPhiloxW0;
using kernels::detail::kPhiloxW1;

/// The round keys of (seed, kPhiloxKey1): round r XORs k0[r] and k1[r].
struct RoundKeys {
  std::uint32_t k0[10], k1[10];
  explicit RoundKeys(std::uint32_t seed) {
    std::uint32_t a = seed, b = kPhiloxKey1;
    for (int r = 0; r < 10; ++r, a += kPhiloxW0, b += kPhiloxW1) k0[r] = a, k1[r] = b;
  }
};

[[maybe_unused]] void groups_portable(std::uint32_t seed, std::uint64_t step, std::uint64_t first, std::size_t groups,
                                      float* out) {
  for (std::size_t q = 0; q < groups; ++q, out += kPhiloxGroup)
    for (unsigned l = 0; l < 8; ++l) {
      const Philox4 b = philox_block(seed, step, (first + q) * 8 + l);
      for (unsigned k = 0; k < 4; ++k) out[8 * k + l] = uniform_from_bits(b.w[k]);
    }
}

#if GZ_CPU_AVX2  // (AVX-512 builds have it too)
/// uniform_from_bits on 8 lanes.
inline __m256 uniforms8(__m256i words) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words, 8)), _mm256_set1_ps(0x1p-24f));
}
#endif

#if defined(__AVX512F__)
/// Groups first .. first + G - 1 (one vector per word and group).
template <int G>
inline void groups_avx512(const RoundKeys& keys, std::uint64_t step, std::uint64_t first, float* out) {
  // Every lane, through the zero-masking forms: GCC 12's unmasked ones trip -Wmaybe-uninitialized.
  constexpr __mmask8 kAll = 0xFF;
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0), m1 = _mm512_set1_epi64(kPhiloxM1);
  __m512i w0[G], w1[G], w2[G], w3[G];
  for (int q = 0; q < G; ++q) {
    const std::uint64_t block = (first + q) * 8;  // block + l never carries out of its low word
    w0[q] = _mm512_add_epi64(_mm512_set1_epi64(static_cast<std::uint32_t>(block)),
                             _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    w1[q] = _mm512_set1_epi64(static_cast<std::uint32_t>(block >> 32));
    w2[q] = _mm512_set1_epi64(static_cast<std::uint32_t>(step));
    w3[q] = _mm512_set1_epi64(static_cast<std::uint32_t>(step >> 32));
  }
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    const __m512i k0 = _mm512_set1_epi32(static_cast<int>(keys.k0[r]));
    const __m512i k1 = _mm512_set1_epi32(static_cast<int>(keys.k1[r]));
#pragma GCC unroll 4
    for (int q = 0; q < G; ++q) {
      const __m512i p0 = _mm512_maskz_mul_epu32(kAll, m0, w0[q]), p1 = _mm512_maskz_mul_epu32(kAll, m1, w2[q]);
      w0[q] = _mm512_ternarylogic_epi32(_mm512_maskz_srli_epi64(kAll, p1, 32), w1[q], k0, 0x96);  // hi1 ^ w1 ^ k0
      w2[q] = _mm512_ternarylogic_epi32(_mm512_maskz_srli_epi64(kAll, p0, 32), w3[q], k1, 0x96);  // hi0 ^ w3 ^ k1
      w1[q] = p1;                                                                      // lo1
      w3[q] = p0;                                                                      // lo0
    }
  }
  for (int q = 0; q < G; ++q) {
    const __m512i words[4] = {w0[q], w1[q], w2[q], w3[q]};
    for (int k = 0; k < 4; ++k)  // the 8 low halves
      _mm256_storeu_ps(out + kPhiloxGroup * q + 8 * k, uniforms8(_mm512_maskz_cvtepi64_epi32(kAll, words[k])));
  }
}
#elif GZ_CPU_AVX2
/// Groups first .. first + G - 1 (two vectors per word and group: even blocks, odd blocks).
template <int G>
inline void groups_avx2(const RoundKeys& keys, std::uint64_t step, std::uint64_t first, float* out) {
  constexpr int H = 2 * G;  // vector h: blocks 8 (first + h / 2) + (h % 2) + {0, 2, 4, 6}
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0), m1 = _mm256_set1_epi64x(kPhiloxM1);
  __m256i w0[H], w1[H], w2[H], w3[H];
  for (int h = 0; h < H; ++h) {
    const std::uint64_t block = (first + h / 2) * 8;  // block + l never carries out of its low word
    w0[h] = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<std::uint32_t>(block)),
                             _mm256_setr_epi64x(h % 2, 2 + h % 2, 4 + h % 2, 6 + h % 2));
    w1[h] = _mm256_set1_epi64x(static_cast<std::uint32_t>(block >> 32));
    w2[h] = _mm256_set1_epi64x(static_cast<std::uint32_t>(step));
    w3[h] = _mm256_set1_epi64x(static_cast<std::uint32_t>(step >> 32));
  }
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    const __m256i k0 = _mm256_set1_epi32(static_cast<int>(keys.k0[r]));
    const __m256i k1 = _mm256_set1_epi32(static_cast<int>(keys.k1[r]));
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const __m256i p0 = _mm256_mul_epu32(m0, w0[h]), p1 = _mm256_mul_epu32(m1, w2[h]);
      w0[h] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(w1[h], k0));  // hi1 ^ w1 ^ k0
      w2[h] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(w3[h], k1));  // hi0 ^ w3 ^ k1
      w1[h] = p1;                                                                         // lo1
      w3[h] = p0;                                                                         // lo0
    }
  }
  for (int q = 0; q < G; ++q) {
    const __m256i even[4] = {w0[2 * q], w1[2 * q], w2[2 * q], w3[2 * q]};
    const __m256i odd[4] = {w0[2 * q + 1], w1[2 * q + 1], w2[2 * q + 1], w3[2 * q + 1]};
    for (int k = 0; k < 4; ++k)  // blocks 0..7 in lane order
      _mm256_storeu_ps(out + kPhiloxGroup * q + 8 * k,
                       uniforms8(_mm256_blend_epi32(even[k], _mm256_slli_epi64(odd[k], 32), 0xAA)));
  }
}
#endif

}  // namespace

void philox_uniforms(std::uint32_t seed, std::uint64_t step, std::uint64_t first, std::size_t groups, float* out) {
#if defined(__AVX512F__)
  const RoundKeys keys(seed);
  std::size_t q = 0;
  for (; q + 2 <= groups; q += 2) groups_avx512<2>(keys, step, first + q, out + kPhiloxGroup * q);
  if (q < groups) groups_avx512<1>(keys, step, first + q, out + kPhiloxGroup * q);
#elif GZ_CPU_AVX2
  const RoundKeys keys(seed);
  std::size_t q = 0;
  for (; q + 2 <= groups; q += 2) groups_avx2<2>(keys, step, first + q, out + kPhiloxGroup * q);
  if (q < groups) groups_avx2<1>(keys, step, first + q, out + kPhiloxGroup * q);
#else
  groups_portable(seed, step, first, groups, out);
#endif
}

}  // namespace gz::kernels::cpu

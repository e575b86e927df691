// Pieces the CPU loops share (internal to kernels/*_cpu.cc): the input of an
// encode, the prefetch distance, and their 8-lane AVX2 twins.
//
// The gradient g of an encode is float, Half or BFloat16 (kernels/element.h);
// input / input8 widen it exactly, so an encode loop is one template over the
// element type and its math stays float. (A 16-bit load is F16C's convert for
// binary16, a 16-bit shift for bfloat16.)
#pragma once

#include <cstddef>

#include "kernels/element.h"
#include "kernels/hd.h"

#if defined(__AVX2__)
#include <immintrin.h>
#define GZ_CPU_AVX2 1
#endif

namespace gz::kernels::cpu::detail {

/// Explicit prefetch distance in elements (4 KiB): with three or four streams
/// one core keeps too few lines in flight on its own (measured: ~15% faster at 16M).
inline constexpr std::size_t kPrefetchAhead = 1024;

/// What an encode quantizes: v = g + r with error feedback, g without.
template <bool kEf, class G>
inline float input(const G* g, const float* r, std::size_t i) {
  return kEf ? to_float(g[i]) + r[i] : to_float(g[i]);
}

#if GZ_CPU_AVX2
/// combine<kAcc, kScaled> (kernels/combine.h) on 8 lanes: o is the output's
/// 8 floats (read only when accumulating), d the decoded values.
template <bool kAcc, bool kScaled>
inline __m256 combine8(const float* o, __m256 d, float scale) {
  const __m256 v = kAcc ? _mm256_add_ps(_mm256_loadu_ps(o), d) : d;
  return kScaled ? _mm256_mul_ps(v, _mm256_set1_ps(scale)) : v;
}

/// 8 elements from p, widened to float.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const Half* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int l = 0; l < 8; ++l) f[l] = to_float(p[l]);
  return _mm256_load_ps(f);
#endif
}

template <bool kEf, class G>
inline __m256 input8(const G* g, const float* r, std::size_t i) {
  __m256 v = load8(g + i);
  if constexpr (kEf) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
  return v;
}

/// All ones in the lanes holding inf or NaN (is_nonfinite on 8 lanes).
inline __m256 nonfinite_mask(__m256 v) {
  const __m256i e = _mm256_set1_epi32(0x7F800000);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e));
}

/// ef_residual on 8 lanes: v - sent, 0 where that is inf or NaN.
inline __m256 ef_residual8(__m256 v, __m256 sent) {
  const __m256 res = _mm256_sub_ps(v, sent);
  return _mm256_andnot_ps(nonfinite_mask(res), res);
}
#endif

#if defined(__AVX512F__)
/// 16 elements from p, widened to float (AVX-512 loops).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
// The zero-masking forms (all lanes on): GCC 12's unmasked intrinsics pass an
// undefined vector that -Wmaybe-uninitialized flags once inlined (-Werror).
inline __m512 load16(const BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}
inline __m512 load16(const Half* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

}  // namespace gz::kernels::cpu::detail

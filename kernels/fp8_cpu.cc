// CPU loop of the fp8 codec over kernels/fp8.h. Per block: pass 1 finds the
// largest finite |v| of v = g + r (the scale), pass 2 converts, writes the
// codes and the residual while the block is still in L1.
//
// With AVX2 both passes run 8 lanes at a time; the conversions are the
// integer and float-add steps of Fp8Format::encode / decode on lanes (F16C
// has no 8-bit format), and 32 codes leave as one 32-byte store.
// tests/codecs/fp8_test.cc checks the lanes against the element functions on
// every code and on every rounding boundary.
#include <algorithm>
#include <cstring>

#include "kernels/cpu_loops.h"
#include "kernels/error_feedback.h"
#include "kernels/fp8.h"

namespace gz::kernels::cpu {
namespace {

using namespace detail;

template <class Fmt, bool kEf, class G>
inline void convert_one(const G* g, float* r, std::size_t i, Fp8Scale s, std::uint8_t* codes) {
  const float v = input<kEf>(g, r, i);
  const std::uint32_t c = fp8_code<Fmt>(v, s.inv);
  codes[i] = static_cast<std::uint8_t>(c);
  if constexpr (kEf) r[i] = ef_residual(v, fp8_value<Fmt>(c, s.scale));
}

#if GZ_CPU_AVX2
inline __m256i splat(std::uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }

template <class Fmt>
struct Lanes {
  /// Fmt::encode on 8 lanes.
  static __m256i encode(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), splat(0x80));
    const __m256i a = _mm256_and_si256(bits, splat(0x7FFFFFFFu));
    // normal: rebias, round to kMan bits (ties to even), saturate
    const __m256i r = _mm256_sub_epi32(a, splat(static_cast<std::uint32_t>(127 - Fmt::bias) << 23));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(r, 23 - Fmt::man_bits), splat(1));
    __m256i normal = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(r, splat((1u << (22 - Fmt::man_bits)) - 1u)), lsb),
                                       23 - Fmt::man_bits);
    normal = _mm256_min_epu32(normal, splat(Fmt::max_code));
    // subnormal: |x| + magic, minus the magic's bits
    const __m256 magic = _mm256_set1_ps(Fmt::subnormal_magic);
    const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), magic)),
                                         _mm256_castps_si256(magic));
    const __m256i is_normal = _mm256_cmpgt_epi32(a, splat(Fmt::min_normal_bits - 1));
    __m256i code = _mm256_or_si256(sign, _mm256_blendv_epi8(sub, normal, is_normal));
    // inf and NaN (a >= 0x7F800000; a <= 0x7FFFFFFF so the signed compares hold)
    const __m256i is_inf = _mm256_cmpeq_epi32(a, splat(0x7F800000u));
    const __m256i is_nan = _mm256_cmpgt_epi32(a, splat(0x7F800000u));
    const __m256i inf_code = Fmt::has_inf ? _mm256_or_si256(sign, splat(Fmt::inf_code)) : splat(Fmt::nan_code);
    code = _mm256_blendv_epi8(code, inf_code, is_inf);
    return _mm256_blendv_epi8(code, splat(Fmt::nan_code), is_nan);
  }

  /// Fmt::decode on 8 lanes (codes in 32-bit lanes).
  static __m256 decode(__m256i code) {
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, splat(0x80)), 24);
    const __m256i mag = _mm256_and_si256(code, splat(0x7F));
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 23 - Fmt::man_bits),
                                            splat(static_cast<std::uint32_t>(127 - Fmt::bias) << 23));
    const __m256 unit = _mm256_castsi256_ps(splat(static_cast<std::uint32_t>(127 + 1 - Fmt::bias - Fmt::man_bits) << 23));
    const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), unit));
    const __m256i is_sub = _mm256_cmpgt_epi32(splat(1u << Fmt::man_bits), mag);
    __m256i v = _mm256_or_si256(sign, _mm256_blendv_epi8(normal, sub, is_sub));
    if constexpr (Fmt::has_inf) {
      v = _mm256_blendv_epi8(v, _mm256_or_si256(sign, splat(0x7F800000u)), _mm256_cmpeq_epi32(mag, splat(Fmt::inf_code)));
      v = _mm256_blendv_epi8(v, splat(0x7FC00000u), _mm256_cmpgt_epi32(mag, splat(Fmt::inf_code)));
    } else {
      v = _mm256_blendv_epi8(v, splat(0x7FC00000u), _mm256_cmpeq_epi32(mag, splat(Fmt::nan_code)));
    }
    return _mm256_castsi256_ps(v);
  }
};

// Pass 1 on 8 lanes: max of the finite |v| (exact in any order).
template <bool kEf, class G>
float amax_avx2(const G* g, const float* r, std::size_t begin, std::size_t end) {
  __m256 m = _mm256_setzero_ps();
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead, 1);
    const __m256 v = input8<kEf>(g, r, i);
    const __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(splat(0x7FFFFFFFu)));
    m = _mm256_max_ps(m, _mm256_andnot_ps(nonfinite_mask(v), a));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.0f;
  for (float x : lanes) amax = std::max(amax, x);
  for (; i < end; ++i) amax = fp8_amax(amax, input<kEf>(g, r, i));
  return amax;
}

// Codes and residuals of 8 elements; the codes stay in 32-bit lanes.
template <class Fmt, bool kEf, class G>
inline __m256i convert8(const G* g, float* r, std::size_t i, Fp8Scale s) {
  const __m256 v = input8<kEf>(g, r, i);
  const __m256i c = Lanes<Fmt>::encode(_mm256_mul_ps(v, _mm256_set1_ps(s.inv)));
  if constexpr (kEf)  // ef_residual(v, fp8_value(c, scale))
    _mm256_storeu_ps(r + i, ef_residual8(v, _mm256_mul_ps(Lanes<Fmt>::decode(c), _mm256_set1_ps(s.scale))));
  return c;
}

// 32 elements: four lane groups, packed to 32 bytes in element order.
template <class Fmt, bool kEf, class G>
inline void convert32(const G* g, float* r, std::size_t i, Fp8Scale s, std::uint8_t* codes) {
  const __m256i c0 = convert8<Fmt, kEf>(g, r, i, s), c1 = convert8<Fmt, kEf>(g, r, i + 8, s);
  const __m256i c2 = convert8<Fmt, kEf>(g, r, i + 16, s), c3 = convert8<Fmt, kEf>(g, r, i + 24, s);
  // u32 -> u16 -> u8 packs interleave the 128-bit halves; one permute restores element order.
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), ordered);
}

// Elements i..i+7 into o[0..7], combined (kernels/combine.h, 8 lanes).
template <class Fmt, bool kAcc, bool kScaled>
inline void decode8(const std::uint8_t* codes, std::size_t i, float scale, float* o, float out_scale) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
  const __m256 d = _mm256_mul_ps(Lanes<Fmt>::decode(_mm256_cvtepu8_epi32(raw)), _mm256_set1_ps(scale));
  _mm256_storeu_ps(o, combine8<kAcc, kScaled>(o, d, out_scale));
}
#endif  // GZ_CPU_AVX2

template <bool kEf, class G>
float block_amax(const G* g, const float* r, std::size_t begin, std::size_t end) {
#if GZ_CPU_AVX2
  return amax_avx2<kEf>(g, r, begin, end);
#else
  float amax = 0.0f;
  for (std::size_t i = begin; i < end; ++i) amax = fp8_amax(amax, input<kEf>(g, r, i));
  return amax;
#endif
}

template <class Fmt, bool kEf, class G>
void encode(const G* g, float* r, std::size_t n, std::uint32_t block, float* scales, std::uint8_t* codes) {
  const std::size_t blocks = Fp8Layout::blocks(fp8_param(Fmt::exp_bits, block), n);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block, end = std::min<std::size_t>(n, begin + block);
    const Fp8Scale s = fp8_scale<Fmt>(block_amax<kEf>(g, r, begin, end));
    std::memcpy(&scales[b], &s.scale, sizeof(float));
    std::size_t i = begin;
#if GZ_CPU_AVX2
    for (; i + 32 <= end; i += 32) convert32<Fmt, kEf>(g, r, i, s, codes);
#endif
    for (; i < end; ++i) convert_one<Fmt, kEf>(g, r, i, s, codes);
  }
  for (std::size_t i = n; i % 4 != 0; ++i) codes[i] = 0;  // padding
}

// Elements [first, last) into out[0 .. last - first).
template <class Fmt, bool kAcc, bool kScaled>
void decode(const float* scales, const std::uint8_t* codes, std::uint32_t block, std::size_t first, std::size_t last,
            float* out, float out_scale) {
  for (std::size_t b = first / block; b * block < last; ++b) {
    const std::size_t begin = std::max(first, b * block), end = std::min<std::size_t>(last, (b + 1) * std::size_t{block});
    float scale;
    std::memcpy(&scale, &scales[b], sizeof scale);
    for (std::size_t p = begin; p < end; p += 16) __builtin_prefetch(out + (p - first) + kPrefetchAhead, 1);
    std::size_t i = begin;
#if GZ_CPU_AVX2
    for (; i + 8 <= end; i += 8) decode8<Fmt, kAcc, kScaled>(codes, i, scale, out + (i - first), out_scale);
#endif
    for (; i < end; ++i) {
      float& o = out[i - first];
      o = combine<kAcc, kScaled>(o, fp8_value<Fmt>(codes[i], scale), out_scale);
    }
  }
}

}  // namespace

template <class G>
void fp8_encode(const G* g, float* r, std::size_t n, std::uint32_t exp_bits, std::uint32_t block, float* scales,
                std::uint8_t* codes) {
  if (exp_bits == 4)
    r ? encode<Fp8E4M3, true>(g, r, n, block, scales, codes) : encode<Fp8E4M3, false>(g, r, n, block, scales, codes);
  else
    r ? encode<Fp8E5M2, true>(g, r, n, block, scales, codes) : encode<Fp8E5M2, false>(g, r, n, block, scales, codes);
}

#define GZ_INSTANTIATE(G) \
  template void fp8_encode(const G*, float*, std::size_t, std::uint32_t, std::uint32_t, float*, std::uint8_t*);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

void fp8_decode(const float* scales, const std::uint8_t* codes, std::uint32_t exp_bits, std::uint32_t block,
                std::size_t begin, std::size_t end, float* out, Combine c) {
  if (begin >= end) return;
  with_combine(c, [&](auto acc, auto scaled) {
    if (exp_bits == 4)
      decode<Fp8E4M3, acc, scaled>(scales, codes, block, begin, end, out, c.scale);
    else
      decode<Fp8E5M2, acc, scaled>(scales, codes, block, begin, end, out, c.scale);
  });
}

}  // namespace gz::kernels::cpu

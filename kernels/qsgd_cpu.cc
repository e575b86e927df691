// CPU loop of the qsgd codec over kernels/qsgd.h. Per bucket: pass 1 finds the
// min, max and any inf/NaN of v = g + r (the scale), pass 2 quantizes, packs
// and writes the residual while the bucket is still in L1.
//
// Pass 2 works in groups of 32 elements, which fill exactly B code words. A
// group that starts at a multiple of 32 and lies inside one bucket takes the
// group path (with AVX2 and B = 2, 4 or 8: 8 lanes at a time, codes packed
// with variable shifts and an OR across lanes); the elements of any other
// group (bucket sizes that are not multiples of 32, the tail) go one by one.
// tests/codecs/test_qsgd.cc checks both against the element functions.
#include <algorithm>
#include <cstring>

#include "kernels/cpu_loops.h"
#include "kernels/error_feedback.h"
#include "kernels/qsgd.h"

namespace gz::kernels::cpu {
namespace {

using namespace detail;

constexpr std::size_t kGroup = 32;

/// The dithers of the 32 elements from i (a multiple of 32): philox_uniform,
/// one Philox block per 4 draws.
inline void group_dithers(const QsgdRounding& rnd, std::size_t i, float* out) {
  if (!rnd.stochastic) {
    std::fill(out, out + kGroup, 0.5f);
    return;
  }
  for (unsigned l = 0; l < 8; ++l) {
    const Philox4 b = philox_block(rnd.seed, rnd.step, i / kGroup * 8 + l);
    for (unsigned k = 0; k < 4; ++k) out[8 * k + l] = uniform_from_bits(b.w[k]);
  }
}

struct Bucket {
  QsgdScale scale;
  float inv;
};

// ---- pass 1: the scale ------------------------------------------------------

template <bool kEf, class G>
Bucket scan_portable(const G* g, const float* r, std::size_t begin, std::size_t end, std::uint32_t bits) {
  float lo = kQsgdClamp, hi = -kQsgdClamp;
  bool bad = false;
  for (std::size_t i = begin; i < end; ++i) {
    const float v = input<kEf>(g, r, i);
    bad |= is_nonfinite(v);
    const float c = qsgd_clamp(v);
    lo = select(c < lo, c, lo);
    hi = select(c > hi, c, hi);
  }
  const QsgdScale s = qsgd_scale(lo, hi, bad, bits);
  return Bucket{s, qsgd_inverse(s.unit)};
}

// ---- pass 2, one element at a time -------------------------------------------

// Element i: its level into the code stream (OR: the group's words were
// zeroed when its first element came), its residual.
template <bool kEf, class G>
inline void quantize_one(const G* g, float* r, std::size_t i, const Bucket& b, std::uint32_t bits, float dither,
                         std::uint32_t* words) {
  const float v = input<kEf>(g, r, i);
  const std::uint32_t q = qsgd_level(v, b.scale, b.inv, dither, qsgd_levels(bits));
  const std::uint64_t p = static_cast<std::uint64_t>(i) * bits;
  const unsigned shift = static_cast<unsigned>(p % 32);
  words[p / 32] |= q << shift;
  if (shift + bits > 32) words[p / 32 + 1] |= q >> (32 - shift);
  if constexpr (kEf) r[i] = ef_residual(v, qsgd_value(q, b.scale));
}

// Zeroes the words of the group that starts at element i (clipped to the stream).
inline void zero_group_words(std::uint32_t* words, std::size_t i, std::uint32_t bits, std::uint64_t total_words) {
  const std::uint64_t first = i / kGroup * bits;
  const std::uint64_t last = std::min<std::uint64_t>(first + bits, total_words);
  if (last > first) std::memset(words + first, 0, (last - first) * sizeof(std::uint32_t));
}

// ---- pass 2, a group of 32 inside one bucket ---------------------------------

template <bool kEf, class G>
void group_portable(const G* g, float* r, std::size_t i, const Bucket& b, std::uint32_t bits,
                    const QsgdRounding& rnd, std::uint32_t* words) {
  float dither[kGroup];
  group_dithers(rnd, i, dither);
  std::uint64_t acc = 0;  // bits not yet stored
  unsigned filled = 0;
  std::uint32_t* out = words + i / kGroup * bits;
  for (std::size_t j = 0; j < kGroup; ++j) {
    const float v = input<kEf>(g, r, i + j);
    const std::uint32_t q = qsgd_level(v, b.scale, b.inv, dither[j], qsgd_levels(bits));
    if constexpr (kEf) r[i + j] = ef_residual(v, qsgd_value(q, b.scale));
    acc |= static_cast<std::uint64_t>(q) << filled;
    filled += bits;
    if (filled >= 32) {
      *out++ = static_cast<std::uint32_t>(acc);
      acc >>= 32;
      filled -= 32;
    }
  }
}

#if GZ_CPU_AVX2
// OR of the 8 lanes.
inline std::uint32_t or_lanes(__m256i x) {
  __m128i t = _mm_or_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  t = _mm_or_si128(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_or_si128(t, _mm_shuffle_epi32(t, 0xB1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(t));
}
// OR of lanes 0..3 and of lanes 4..7.
inline void or_quads(__m256i x, std::uint32_t* out) {
  __m128i lo = _mm256_castsi256_si128(x), hi = _mm256_extracti128_si256(x, 1);
  lo = _mm_or_si128(lo, _mm_shuffle_epi32(lo, 0x4E));
  hi = _mm_or_si128(hi, _mm_shuffle_epi32(hi, 0x4E));
  lo = _mm_or_si128(lo, _mm_shuffle_epi32(lo, 0xB1));
  hi = _mm_or_si128(hi, _mm_shuffle_epi32(hi, 0xB1));
  out[0] = static_cast<std::uint32_t>(_mm_cvtsi128_si32(lo));
  out[1] = static_cast<std::uint32_t>(_mm_cvtsi128_si32(hi));
}

// Philox4x32-10 on 8 blocks at once (lane l: block 8 (i / 32) + l), the
// lanes' twin of philox_block: word k of the 8 blocks is the draws of
// elements i + 8k .. i + 8k + 7 (philox_uniform), as uniform_from_bits.
inline void mulhilo8(std::uint32_t m, __m256i b, __m256i& hi, __m256i& lo) {
  const __m256i mv = _mm256_set1_epi32(static_cast<int>(m));
  const __m256i even = _mm256_mul_epu32(mv, b);                        // lanes 0, 2, 4, 6 as 64-bit products
  const __m256i odd = _mm256_mul_epu32(mv, _mm256_srli_epi64(b, 32));  // lanes 1, 3, 5, 7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

void dithers_avx2(const QsgdRounding& rnd, std::size_t i, __m256* out) {
  const std::uint64_t first = i / kGroup * 8;
  __m256i w0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first))),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // The high counter word: first is a multiple of 8, so first + l never carries out of the low word.
  __m256i w1 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first >> 32)));
  __m256i w2 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(rnd.step)));
  __m256i w3 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(rnd.step >> 32)));
  std::uint32_t k0 = rnd.seed, k1 = kPhiloxKey1;
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(kernels::detail::kPhiloxM0, w0, hi0, lo0);
    mulhilo8(kernels::detail::kPhiloxM1, w2, hi1, lo1);
    const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, w1), _mm256_set1_epi32(static_cast<int>(k0)));
    const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, w3), _mm256_set1_epi32(static_cast<int>(k1)));
    w0 = n0, w1 = lo1, w2 = n2, w3 = lo0;
    k0 += kernels::detail::kPhiloxW0;
    k1 += kernels::detail::kPhiloxW1;
  }
  const __m256 scale = _mm256_set1_ps(0x1p-24f);
  const __m256i words[4] = {w0, w1, w2, w3};
  for (int k = 0; k < 4; ++k) out[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words[k], 8)), scale);
}

// Pass 1 on 8 lanes; the lane order of min and max does not matter (exact).
template <bool kEf, class G>
Bucket scan_avx2(const G* g, const float* r, std::size_t begin, std::size_t end, std::uint32_t bits) {
  const __m256 clamp = _mm256_set1_ps(kQsgdClamp), nclamp = _mm256_set1_ps(-kQsgdClamp);
  __m256 lo8 = clamp, hi8 = nclamp, bad8 = _mm256_setzero_ps();
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead, 1);
    const __m256 v = input8<kEf>(g, r, i);
    bad8 = _mm256_or_ps(bad8, nonfinite_mask(v));
    const __m256 c = _mm256_min_ps(_mm256_max_ps(v, nclamp), clamp);  // NaN lanes: flagged by bad8
    lo8 = _mm256_min_ps(lo8, c);
    hi8 = _mm256_max_ps(hi8, c);
  }
  alignas(32) float lo_l[8], hi_l[8];
  _mm256_store_ps(lo_l, lo8);
  _mm256_store_ps(hi_l, hi8);
  float lo = kQsgdClamp, hi = -kQsgdClamp;
  for (int l = 0; l < 8; ++l) lo = std::min(lo, lo_l[l]), hi = std::max(hi, hi_l[l]);
  bool bad = _mm256_movemask_ps(bad8) != 0;
  for (; i < end; ++i) {
    const float v = input<kEf>(g, r, i);
    bad |= is_nonfinite(v);
    const float c = qsgd_clamp(v);
    lo = std::min(lo, c), hi = std::max(hi, c);
  }
  const QsgdScale s = qsgd_scale(lo, hi, bad, bits);
  return Bucket{s, qsgd_inverse(s.unit)};
}

// Levels of 8 elements (qsgd_level on 8 lanes) and their residual.
template <bool kEf, class G>
inline __m256i levels8(const G* g, float* r, std::size_t i, const Bucket& b, __m256 dither, __m256 top) {
  const __m256 v = input8<kEf>(g, r, i);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-kQsgdClamp)), _mm256_set1_ps(kQsgdClamp));
  const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(c, _mm256_set1_ps(b.scale.lo)), _mm256_set1_ps(b.inv)),
                                 dither);
  // max(y, 0) gives 0 for NaN (its second operand), as qsgd_level's selects do.
  const __m256i q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(y, _mm256_setzero_ps()), top));
  if constexpr (kEf) {  // ef_residual(v, qsgd_value(q, scale))
    const __m256 d = _mm256_add_ps(_mm256_set1_ps(b.scale.lo),
                                   _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(b.scale.unit)));
    _mm256_storeu_ps(r + i, ef_residual8(v, d));
  }
  return q;
}

template <bool kEf, class G>
void group_avx2(const G* g, float* r, std::size_t i, const Bucket& b, std::uint32_t bits,
                const QsgdRounding& rnd, std::uint32_t* words) {
  const __m256 top = _mm256_set1_ps(static_cast<float>(qsgd_levels(bits)));
  __m256i q[4];
  if (rnd.stochastic) {
    __m256 dither[4];
    dithers_avx2(rnd, i, dither);
    for (int k = 0; k < 4; ++k) q[k] = levels8<kEf>(g, r, i + 8 * k, b, dither[k], top);
  } else {
    for (int k = 0; k < 4; ++k) q[k] = levels8<kEf>(g, r, i + 8 * k, b, _mm256_set1_ps(0.5f), top);
  }
  std::uint32_t* out = words + i / kGroup * bits;
  switch (bits) {
    case 2: {  // 16 codes per word
      const __m256i lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), hi = _mm256_add_epi32(lo, _mm256_set1_epi32(16));
      out[0] = or_lanes(_mm256_or_si256(_mm256_sllv_epi32(q[0], lo), _mm256_sllv_epi32(q[1], hi)));
      out[1] = or_lanes(_mm256_or_si256(_mm256_sllv_epi32(q[2], lo), _mm256_sllv_epi32(q[3], hi)));
      break;
    }
    case 4: {  // 8 codes per word
      const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
      for (int k = 0; k < 4; ++k) out[k] = or_lanes(_mm256_sllv_epi32(q[k], sh));
      break;
    }
    default: {  // 8: 4 codes per word
      const __m256i sh = _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24);
      for (int k = 0; k < 4; ++k) or_quads(_mm256_sllv_epi32(q[k], sh), out + 2 * k);
      break;
    }
  }
}

// Decode of a group of 32 inside one bucket, B = 2, 4 or 8.
// The 32 elements of group i/32 into o[0..31], combined (kernels/combine.h).
template <bool kAcc, bool kScaled>
void decode_group_avx2(const std::uint32_t* in, std::size_t i, QsgdScale s, std::uint32_t bits, float* o,
                       float out_scale) {
  const __m256 lo = _mm256_set1_ps(s.lo), unit = _mm256_set1_ps(s.unit);
  auto add8 = [&](std::size_t at, __m256i q) {  // o[at - i ..] = combine(o, lo + q * unit)
    const __m256 d = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_cvtepi32_ps(q), unit));
    float* p = o + (at - i);
    _mm256_storeu_ps(p, combine8<kAcc, kScaled>(p, d, out_scale));
  };
  const std::uint32_t* w = in + i / kGroup * bits;
  switch (bits) {
    case 2: {
      const __m256i lo_sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), mask = _mm256_set1_epi32(3);
      const __m256i hi_sh = _mm256_add_epi32(lo_sh, _mm256_set1_epi32(16));
      for (int k = 0; k < 2; ++k) {
        const __m256i x = _mm256_set1_epi32(static_cast<int>(w[k]));
        add8(i + 16 * k, _mm256_and_si256(_mm256_srlv_epi32(x, lo_sh), mask));
        add8(i + 16 * k + 8, _mm256_and_si256(_mm256_srlv_epi32(x, hi_sh), mask));
      }
      break;
    }
    case 4: {
      const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), mask = _mm256_set1_epi32(15);
      for (int k = 0; k < 4; ++k)
        add8(i + 8 * k, _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[k])), sh), mask));
      break;
    }
    default: {
      const __m256i sh = _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24), mask = _mm256_set1_epi32(255);
      for (int k = 0; k < 4; ++k) {
        const __m256i x = _mm256_setr_epi32(static_cast<int>(w[2 * k]), static_cast<int>(w[2 * k]),
                                            static_cast<int>(w[2 * k]), static_cast<int>(w[2 * k]),
                                            static_cast<int>(w[2 * k + 1]), static_cast<int>(w[2 * k + 1]),
                                            static_cast<int>(w[2 * k + 1]), static_cast<int>(w[2 * k + 1]));
        add8(i + 8 * k, _mm256_and_si256(_mm256_srlv_epi32(x, sh), mask));
      }
      break;
    }
  }
}
#endif  // GZ_CPU_AVX2

// The lane-wide paths cover the widths whose codes never straddle a word.
inline bool simd_bits(std::uint32_t bits) { return bits == 2 || bits == 4 || bits == 8; }

template <bool kEf, class G>
void encode(const G* g, float* r, std::size_t n, std::uint32_t bits, std::uint32_t bucket,
            const QsgdRounding& rnd, QsgdScale* scales, std::uint32_t* words) {
  const std::uint32_t param = qsgd_param(bits, bucket);
  const std::uint64_t total_words = QsgdLayout::words(param, n);
  const std::size_t buckets = QsgdLayout::buckets(param, n);
  for (std::size_t bi = 0; bi < buckets; ++bi) {
    const std::size_t begin = bi * bucket, end = std::min<std::size_t>(n, begin + bucket);
#if GZ_CPU_AVX2
    const Bucket b = scan_avx2<kEf>(g, r, begin, end, bits);
#else
    const Bucket b = scan_portable<kEf>(g, r, begin, end, bits);
#endif
    std::memcpy(&scales[bi], &b.scale, sizeof b.scale);
    for (std::size_t i = begin; i < end;) {
      if (i % kGroup == 0 && i + kGroup <= end) {
#if GZ_CPU_AVX2
        if (simd_bits(bits))
          group_avx2<kEf>(g, r, i, b, bits, rnd, words);
        else
          group_portable<kEf>(g, r, i, b, bits, rnd, words);
#else
        group_portable<kEf>(g, r, i, b, bits, rnd, words);
#endif
        i += kGroup;
        continue;
      }
      if (i % kGroup == 0) zero_group_words(words, i, bits, total_words);
      quantize_one<kEf>(g, r, i, b, bits, qsgd_dither(rnd.stochastic, rnd.seed, rnd.step, i), words);
      ++i;
    }
  }
}

}  // namespace

template <class G>
void qsgd_encode(const G* g, float* r, std::size_t n, std::uint32_t bits, std::uint32_t bucket,
                 const QsgdRounding& rounding, QsgdScale* scales, std::uint32_t* words) {
  if (r)
    encode<true>(g, r, n, bits, bucket, rounding, scales, words);
  else
    encode<false>(g, r, n, bits, bucket, rounding, scales, words);
}

namespace {

// Elements [first, last) into out[0 .. last - first).
template <bool kAcc, bool kScaled>
void decode(const QsgdScale* scales, const std::uint32_t* words, std::uint32_t bits, std::uint32_t bucket,
            std::size_t first, std::size_t last, float* out, float out_scale) {
  for (std::size_t bi = first / bucket; bi * bucket < last; ++bi) {
    const std::size_t begin = std::max(first, bi * bucket);
    const std::size_t end = std::min<std::size_t>(last, (bi + 1) * std::size_t{bucket});
    QsgdScale s;
    std::memcpy(&s, &scales[bi], sizeof s);
    for (std::size_t p = begin; p < end; p += 16) __builtin_prefetch(out + (p - first) + kPrefetchAhead, 1);
    for (std::size_t i = begin; i < end;) {
#if GZ_CPU_AVX2
      if (simd_bits(bits) && i % kGroup == 0 && i + kGroup <= end) {
        decode_group_avx2<kAcc, kScaled>(words, i, s, bits, out + (i - first), out_scale);
        i += kGroup;
        continue;
      }
#endif
      float& o = out[i - first];
      o = combine<kAcc, kScaled>(o, qsgd_value(qsgd_code_at(words, i, bits), s), out_scale);
      ++i;
    }
  }
}

}  // namespace

#define GZ_INSTANTIATE(G)                                                                                   \
  template void qsgd_encode(const G*, float*, std::size_t, std::uint32_t, std::uint32_t, const QsgdRounding&, \
                            QsgdScale*, std::uint32_t*);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

void qsgd_decode(const QsgdScale* scales, const std::uint32_t* words, std::uint32_t bits, std::uint32_t bucket,
                 std::size_t begin, std::size_t end, float* out, Combine c) {
  if (begin >= end) return;
  with_combine(c, [&](auto acc, auto scaled) { decode<acc, scaled>(scales, words, bits, bucket, begin, end, out, c.scale); });
}

}  // namespace gz::kernels::cpu

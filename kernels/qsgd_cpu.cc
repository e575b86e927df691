// CPU loop of the qsgd codec over kernels/qsgd.h. Per bucket: pass 1 finds the
// min, max and any inf/NaN of v = g + r (the scale), pass 2 quantizes, packs
// and writes the residual while the bucket is still in L1.
//
// Pass 2 works in groups of 32 elements, which fill exactly B code words. A
// group that starts at a multiple of 32 and lies inside one bucket takes the
// group path (with AVX2 and B = 2, 4 or 8: 8 lanes at a time, the levels
// narrowed to bytes with saturating packs and merged into 4- or 2-bit fields
// with multiply-adds); the elements of any other group (bucket sizes that are
// not multiples of 32, the tail) go one by one. Stochastic rounding draws the
// dithers of up to kChunkGroups groups at once (cpu::philox_uniforms, SIMD
// lanes) before quantizing them: the Philox rounds then run back to back,
// interleaved, instead of one dependent chain per group.
// tests/codecs/qsgd_test.cc checks both against the element functions.
#include <algorithm>
#include <cstring>

#include "kernels/cpu_loops.h"
#include "kernels/error_feedback.h"
#include "kernels/qsgd.h"

namespace gz::kernels::cpu {
namespace {

using namespace detail;

constexpr std::size_t kGroup = kPhiloxGroup;
/// Groups whose dithers are drawn at once (2 KiB of floats, in L1).
constexpr std::size_t kChunkGroups = 16;

struct Bucket {
  QsgdScale scale;
  float inv;
  /// Every value finite and within +-kQsgdClamp: the clamp is the identity and
  /// no residual can be inf or NaN (|v - sent| <= 2^127), so the lanes skip both.
  bool clean = false;
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

// dither: the group's 32 draws, or nullptr for round to nearest (0.5).
template <bool kEf, class G>
void group_portable(const G* g, float* r, std::size_t i, const Bucket& b, std::uint32_t bits, const float* dither,
                    std::uint32_t* words) {
  std::uint64_t acc = 0;  // bits not yet stored
  unsigned filled = 0;
  std::uint32_t* out = words + i / kGroup * bits;
  for (std::size_t j = 0; j < kGroup; ++j) {
    const float v = input<kEf>(g, r, i + j);
    const std::uint32_t q = qsgd_level(v, b.scale, b.inv, dither ? dither[j] : 0.5f, qsgd_levels(bits));
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
// Pass 1 on 8 lanes. The min and max of the unclamped values, clamped once at
// the end, are those of the clamped values (the clamp is monotone; a bucket
// with inf or NaN sends NaN whatever they are), and exact in any lane order.
// inf and NaN are the magnitudes (sign bit cleared) from 0x7F800000 up.
template <bool kEf, class G>
Bucket scan_avx2(const G* g, const float* r, std::size_t begin, std::size_t end, std::uint32_t bits) {
  const __m256i abs_bits = _mm256_set1_epi32(0x7FFFFFFF);
  __m256 lo8 = _mm256_set1_ps(kQsgdClamp), hi8 = _mm256_set1_ps(-kQsgdClamp);
  __m256i mag8 = _mm256_setzero_si256();
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead, 1);
    const __m256 v = input8<kEf>(g, r, i);
    mag8 = _mm256_max_epu32(mag8, _mm256_and_si256(_mm256_castps_si256(v), abs_bits));
    lo8 = _mm256_min_ps(lo8, v);  // a NaN lane leaves garbage: its bucket is flagged by mag8
    hi8 = _mm256_max_ps(hi8, v);
  }
  alignas(32) float lo_l[8], hi_l[8];
  alignas(32) std::uint32_t mag_l[8];
  _mm256_store_ps(lo_l, lo8);
  _mm256_store_ps(hi_l, hi8);
  _mm256_store_si256(reinterpret_cast<__m256i*>(mag_l), mag8);
  float lo = kQsgdClamp, hi = -kQsgdClamp;
  bool bad = false;
  for (int l = 0; l < 8; ++l) lo = std::min(lo, lo_l[l]), hi = std::max(hi, hi_l[l]), bad |= mag_l[l] >= 0x7F800000u;
  for (; i < end; ++i) {
    const float v = input<kEf>(g, r, i);
    bad |= is_nonfinite(v);
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  const bool clean = !bad && lo >= -kQsgdClamp && hi <= kQsgdClamp;
  const QsgdScale s = qsgd_scale(qsgd_clamp(lo), qsgd_clamp(hi), bad, bits);
  return Bucket{s, qsgd_inverse(s.unit), clean};
}

// Levels of 8 elements (qsgd_level on 8 lanes) and their residual; kClean:
// the bucket is clean (Bucket::clean), so no clamp and no non-finite residual.
template <bool kEf, bool kClean, class G>
inline __m256i levels8(const G* g, float* r, std::size_t i, const Bucket& b, __m256 dither, __m256 top) {
  const __m256 v = input8<kEf>(g, r, i);
  const __m256 c =
      kClean ? v : _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-kQsgdClamp)), _mm256_set1_ps(kQsgdClamp));
  const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(c, _mm256_set1_ps(b.scale.lo)), _mm256_set1_ps(b.inv)),
                                 dither);
  // max(y, 0) gives 0 for NaN (its second operand), as qsgd_level's selects do.
  const __m256i q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(y, _mm256_setzero_ps()), top));
  if constexpr (kEf) {  // ef_residual(v, qsgd_value(q, scale))
    const __m256 d = _mm256_add_ps(_mm256_set1_ps(b.scale.lo),
                                   _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(b.scale.unit)));
    _mm256_storeu_ps(r + i, kClean ? _mm256_sub_ps(v, d) : ef_residual8(v, d));
  }
  return q;
}

// The 32 levels of a group (q[k] lane l: element 8k + l, each <= 255) as 32
// bytes in element order.
inline __m256i levels_to_bytes(const __m256i q[4]) {
  // Saturating packs keep the values; per 128-bit half they interleave the
  // inputs, leaving elements 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31.
  const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// dither: the group's 32 draws, or nullptr for round to nearest (0.5).
template <bool kEf, class G>
void group_avx2(const G* g, float* r, std::size_t i, const Bucket& b, std::uint32_t bits, const float* dither,
                std::uint32_t* words) {
  const __m256 top = _mm256_set1_ps(static_cast<float>(qsgd_levels(bits)));
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 u = dither ? _mm256_loadu_ps(dither + 8 * k) : _mm256_set1_ps(0.5f);
    q[k] = b.clean ? levels8<kEf, true>(g, r, i + 8 * k, b, u, top) : levels8<kEf, false>(g, r, i + 8 * k, b, u, top);
  }
  const __m256i e = levels_to_bytes(q);  // byte j: the level of element j
  void* out = words + i / kGroup * bits;
  switch (bits) {
    case 2: {  // byte j: elements 4j .. 4j+3, two bits each (levels <= 3: no carries)
      const __m256i pairs = _mm256_maddubs_epi16(e, _mm256_set1_epi16(0x0401));        // e0 + 4 e1
      const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));  // p0 + 16 p1
      // 32-bit lanes 0-3 | 4-7 hold the bytes of elements 0-15 | 16-31: narrow, then join the halves.
      const __m256i x = _mm256_packus_epi16(_mm256_packs_epi32(quads, quads), quads);
      const __m256i y = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
      _mm_storel_epi64(static_cast<__m128i*>(out), _mm256_castsi256_si128(y));
      break;
    }
    case 4: {  // byte j: elements 2j, 2j+1, four bits each (levels <= 15: no carries)
      const __m256i pairs = _mm256_maddubs_epi16(e, _mm256_set1_epi16(0x1001));  // e0 + 16 e1
      // 16-bit lanes 0-7 | 8-15 hold the bytes of elements 0-15 | 16-31: narrow, then join the halves.
      const __m256i x = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
      _mm_storeu_si128(static_cast<__m128i*>(out), _mm256_castsi256_si128(x));
      break;
    }
    default:  // 8: byte j is element j
      _mm256_storeu_si256(static_cast<__m256i*>(out), e);
      break;
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
      if (i % kGroup == 0 && i + kGroup <= end) {  // up to kChunkGroups whole groups
        const std::size_t groups = std::min(kChunkGroups, (end - i) / kGroup);
        alignas(32) float draws[kChunkGroups * kGroup];
        const float* dither = nullptr;
        if (rnd.stochastic) {
          philox_uniforms(rnd.seed, rnd.step, i / kGroup, groups, draws);
          dither = draws;
        }
        for (std::size_t q = 0; q < groups; ++q, i += kGroup) {
          const float* d = dither ? dither + q * kGroup : nullptr;
#if GZ_CPU_AVX2
          if (simd_bits(bits))
            group_avx2<kEf>(g, r, i, b, bits, d, words);
          else
            group_portable<kEf>(g, r, i, b, bits, d, words);
#else
          group_portable<kEf>(g, r, i, b, bits, d, words);
#endif
        }
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

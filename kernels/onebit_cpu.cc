// CPU loop of the onebit codec. Per block: pass 1 forms the 32 lane sums in the
// order kernels/onebit.h defines (vectorized across lanes), pass 2 writes the
// sign bits and the residual while the block is still in L1.
//
// With AVX-512 the full 32-element rows use masked adds and mask registers
// (a third of the instructions of what g++ makes of the portable loop);
// tests/codecs/onebit_test.cc checks both against an independent write-out of
// the summation order.
#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/cpu.h"
#include "kernels/cpu_loops.h"
#include "kernels/error_feedback.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define GZ_CPU_AVX512 1
#endif

namespace gz::kernels::cpu {
namespace {

using namespace detail;

constexpr int L = kOnebitLanes;

// One core keeps too few lines in flight on its own: prefetch explicitly.
template <bool kEf, class G>
inline void prefetch_row(const G* g, const float* r, std::size_t i) {
  __builtin_prefetch(g + i + kPrefetchAhead);
  __builtin_prefetch(g + i + kPrefetchAhead + 16);
  if constexpr (kEf) {
    __builtin_prefetch(r + i + kPrefetchAhead);
    __builtin_prefetch(r + i + kPrefetchAhead + 16);
  }
}

// Adds `rows` full rows of 32 elements starting at `begin` into the lanes
// (OnebitPartial::add per lane, in row order).
template <bool kEf, class G>
void add_rows(const G* g, const float* r, std::size_t begin, std::size_t rows, OnebitPartial* lane) {
#if GZ_CPU_AVX512
  // Lanes 8q..8q+7 live in pos[q] / neg[q]; a masked add leaves the other sum
  // as it is, which equals adding +0.0 (neither sum can be -0.0).
  __m512d pos[4], neg[4];
  for (int q = 0; q < 4; ++q) pos[q] = neg[q] = _mm512_setzero_pd();
  std::uint32_t count = 0;
  for (std::size_t row = 0; row < rows; ++row) {
    const std::size_t i = begin + row * L;
    prefetch_row<kEf>(g, r, i);
    for (int q = 0; q < 4; ++q) {
      __m256 v = load8(g + i + 8 * q);
      if constexpr (kEf) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i + 8 * q));
      const __m512d x = _mm512_maskz_cvtps_pd(0xFF, v);  // (the unmasked form trips GCC 12 -Wmaybe-uninitialized)
      const __mmask8 m = _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_LT_OQ);  // exact for float inputs
      neg[q] = _mm512_mask_add_pd(neg[q], m, neg[q], x);
      pos[q] = _mm512_mask_add_pd(pos[q], static_cast<__mmask8>(~m), pos[q], x);
      count += static_cast<std::uint32_t>(std::popcount(static_cast<unsigned>(m)));
    }
  }
  alignas(64) double p[L], n[L];
  for (int q = 0; q < 4; ++q) _mm512_store_pd(p + 8 * q, pos[q]), _mm512_store_pd(n + 8 * q, neg[q]);
  for (int l = 0; l < L; ++l) lane[l].pos_sum = p[l], lane[l].neg_sum = n[l];
  lane[0].neg_count = count;  // counts are integers: which lane holds them does not matter
#else
  double pos[L] = {}, neg[L] = {};
  std::uint32_t cnt[L] = {};
  for (std::size_t row = 0; row < rows; ++row) {
    const std::size_t i = begin + row * L;
    prefetch_row<kEf>(g, r, i);
    for (int l = 0; l < L; ++l) {  // OnebitPartial::add, unpacked so the lanes vectorize
      const float v = input<kEf>(g, r, i + l);
      const bool is_neg = onebit_is_negative(v);
      const double x = static_cast<double>(v);
      pos[l] += keep_if(!is_neg, x);
      neg[l] += keep_if(is_neg, x);
      cnt[l] += static_cast<std::uint32_t>(is_neg);
    }
  }
  for (int l = 0; l < L; ++l) lane[l].pos_sum = pos[l], lane[l].neg_sum = neg[l], lane[l].neg_count = cnt[l];
#endif
}

// Pass 1: the block's scales, summed lane-striped then tree-reduced.
template <bool kEf, class G>
OnebitScales block_scales(const G* g, const float* r, std::size_t begin, std::size_t len) {
  OnebitPartial lane[L];
  const std::size_t rows = len / L, j = rows * L;
  add_rows<kEf>(g, r, begin, rows, lane);
  for (int l = 0; j + l < len; ++l) lane[l].add(input<kEf>(g, r, begin + j + l));
  for (int off = L / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) lane[l].merge(lane[l + off]);
  return onebit_scales(lane[0], static_cast<std::uint32_t>(len));
}

// Pass 2 over elements [lo, hi) of one 32-bit sign word (bit b = element base+b).
template <bool kEf, class G>
inline std::uint32_t sign_word(const G* g, float* r, std::size_t base, int lo, int hi, OnebitScales s) {
  std::uint32_t word = 0;
  for (int b = lo; b < hi; ++b) {
    const float v = input<kEf>(g, r, base + b);
    const bool is_neg = onebit_is_negative(v);
    if constexpr (kEf) r[base + b] = ef_residual(v, onebit_value(is_neg, s));
    word |= static_cast<std::uint32_t>(is_neg) << b;
  }
  return word;
}

template <bool kEf, class G>
inline std::uint32_t full_sign_word(const G* g, float* r, std::size_t base, OnebitScales s) {
#if GZ_CPU_AVX512
  const __m512 pos = _mm512_set1_ps(s.pos), neg = _mm512_set1_ps(s.neg);
  const __m512i exp = _mm512_set1_epi32(0x7F800000);
  std::uint32_t word = 0;
  for (int h = 0; h < 2; ++h) {
    const std::size_t i = base + 16 * h;
    __m512 v = load16(g + i);
    if constexpr (kEf) v = _mm512_add_ps(v, _mm512_loadu_ps(r + i));
    const __mmask16 m = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    if constexpr (kEf) {  // ef_residual(v, onebit_value(neg, s))
      const __m512 res = _mm512_sub_ps(v, _mm512_mask_blend_ps(m, pos, neg));
      const __mmask16 bad = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(res), exp), exp);
      _mm512_storeu_ps(r + i, _mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), res));
    }
    word |= static_cast<std::uint32_t>(m) << (16 * h);
  }
  return word;
#else
  std::uint32_t word = 0;
  for (int b = 0; b < 32; ++b) {
    const float v = input<kEf>(g, r, base + b);
    const bool is_neg = onebit_is_negative(v);
    if constexpr (kEf) r[base + b] = ef_residual(v, onebit_value(is_neg, s));
    word |= static_cast<std::uint32_t>(is_neg) << b;
  }
  return word;
#endif
}

template <bool kEf, class G>
void encode(const G* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
            std::uint32_t* bits) {
  std::memset(bits, 0, onebit_words(n) * sizeof(std::uint32_t));
  const std::size_t blocks = onebit_blocks(n, block);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block;
    const std::size_t end = std::min<std::size_t>(n, begin + block);
    const OnebitScales s = block_scales<kEf>(g, r, begin, end - begin);
    scales[b] = s;
    // Words may straddle blocks (when block % 32 != 0): OR each block's part in.
    for (std::size_t i = begin; i < end;) {
      const std::size_t w = i / 32, base = w * 32;
      const int lo = static_cast<int>(i - base);
      const int hi = static_cast<int>(std::min<std::size_t>(end - base, 32));
      bits[w] |= (lo == 0 && hi == 32) ? full_sign_word<kEf>(g, r, base, s) : sign_word<kEf>(g, r, base, lo, hi, s);
      i = base + hi;
    }
  }
}

// Bits lo..hi-1 of the word of elements base..base+31, into out, which
// holds element `first` at out[0] (base + lo >= first).
template <bool kAcc, bool kScaled>
inline void decode_word(std::uint32_t word, std::size_t base, int lo, int hi, OnebitScales s, float scale,
                        float* out, std::size_t first) {
  for (int b = lo; b < hi; ++b) {
    float& o = out[base + static_cast<std::size_t>(b) - first];
    o = combine<kAcc, kScaled>(o, onebit_value((word >> b) & 1u, s), scale);
  }
}

template <bool kAcc, bool kScaled>
inline void decode_full_word(std::uint32_t word, OnebitScales s, float scale, float* o) {
#if GZ_CPU_AVX2
  // Eight bits at a time: lane l tests bit l of the byte and picks neg or pos,
  // the same values onebit_value picks (what g++ made of the loop below took
  // twice the instructions: a variable shift, and, and a bitwise select).
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 pos = _mm256_set1_ps(s.pos), neg = _mm256_set1_ps(s.neg);
  for (int q = 0; q < 4; ++q) {
    const __m256i byte = _mm256_set1_epi32(static_cast<int>((word >> (8 * q)) & 0xFFu));
    const __m256 is_neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, bit), bit));
    _mm256_storeu_ps(o + 8 * q, combine8<kAcc, kScaled>(o + 8 * q, _mm256_blendv_ps(pos, neg, is_neg), scale));
  }
#else
  for (int b = 0; b < 32; ++b) o[b] = combine<kAcc, kScaled>(o[b], onebit_value((word >> b) & 1u, s), scale);
#endif
}

template <bool kAcc, bool kScaled>
void decode(const OnebitScales* scales, const std::uint32_t* bits, std::uint32_t block, std::size_t begin,
            std::size_t end, float* out, float scale) {
  for (std::size_t b = begin / block; b * block < end; ++b) {
    const std::size_t lo_i = std::max<std::size_t>(begin, b * block);
    const std::size_t hi_i = std::min<std::size_t>(end, (b + 1) * std::size_t{block});
    const OnebitScales s = scales[b];
    for (std::size_t p = lo_i; p < hi_i; p += 16) __builtin_prefetch(out + (p - begin) + kPrefetchAhead, 1);
    for (std::size_t i = lo_i; i < hi_i;) {
      const std::size_t w = i / 32, base = w * 32;
      const int lo = static_cast<int>(i - base);
      const int hi = static_cast<int>(std::min<std::size_t>(hi_i - base, 32));
      if (lo == 0 && hi == 32)
        decode_full_word<kAcc, kScaled>(bits[w], s, scale, out + (base - begin));
      else
        decode_word<kAcc, kScaled>(bits[w], base, lo, hi, s, scale, out, begin);
      i = base + hi;
    }
  }
}

}  // namespace

template <class G>
void onebit_encode(const G* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits) {
  if (r)
    encode<true>(g, r, n, block, scales, bits);
  else
    encode<false>(g, r, n, block, scales, bits);
}

#define GZ_INSTANTIATE(G) \
  template void onebit_encode(const G*, float*, std::size_t, std::uint32_t, OnebitScales*, std::uint32_t*);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

void onebit_decode(const OnebitScales* scales, const std::uint32_t* bits, std::uint32_t block, std::size_t begin,
                   std::size_t end, float* out, Combine c) {
  if (begin >= end) return;
  with_combine(c, [&](auto acc, auto scaled) { decode<acc, scaled>(scales, bits, block, begin, end, out, c.scale); });
}

}  // namespace gz::kernels::cpu

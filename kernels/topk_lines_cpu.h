// One cache line of 16 floats: the unit in which top-k's CPU candidate pass
// and emit (kernels/topk_cpu.cc) work, as each instruction set handles it.
// The build picks one set at compile time (-march=native, or the portable
// x86-64 baseline with GRADZIP_NATIVE=OFF):
//
//   AVX-512  one register per line; compares into mask registers, in-register
//            compress (vpcompressd).
//   AVX2     two 8-lane halves; compares + movemask, and the compress is a
//            lane permutation (vpermd) looked up by each half's 8-bit mask.
//   portable 16 scalars; branch-free loops.
//
// Each does the same thing: keys() is topk_key of kernels/topk.h lane by
// lane (NaN included), and the masks have bit b for lane b. tests/codecs/
// topk_test.cc checks all three against topk_key and a scalar compress.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "kernels/element.h"
#include "kernels/topk.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gz::kernels::cpu::topk_line {

inline constexpr std::size_t kWidth = 16;

/// Entries a compress_store() with this mask selected.
inline std::size_t popcount(std::uint32_t mask) { return static_cast<std::size_t>(std::popcount(mask)); }

#if defined(__AVX512F__)

inline constexpr const char* kIsa = "AVX-512";

struct Values {
  __m512 v;
};
struct Words {  // keys or indices
  __m512i v;
};

inline Values load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, Values x) { _mm512_storeu_ps(p, x.v); }
inline Values add(Values a, Values b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Words load(const std::uint32_t* p) { return {_mm512_loadu_si512(p)}; }
/// base, base + 1, ..., base + 15.
inline Words iota(std::uint32_t base) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return {_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(base)))};
}

/// topk_key per lane: |v|'s bits, every NaN mapped to 0x7FFFFFFF.
inline Words keys(Values x) {
  const __m512i a = _mm512_and_si512(_mm512_castps_si512(x.v), _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
  return {_mm512_mask_mov_epi32(a, nan, _mm512_set1_epi32(0x7FFFFFFF))};
}
inline std::uint32_t mask_ge(Words k, std::uint32_t bound) {
  return _mm512_cmpge_epu32_mask(k.v, _mm512_set1_epi32(static_cast<int>(bound)));
}
inline std::uint32_t mask_gt(Words k, std::uint32_t bound) {
  return _mm512_cmpgt_epu32_mask(k.v, _mm512_set1_epi32(static_cast<int>(bound)));
}
inline std::uint32_t mask_eq(Words k, std::uint32_t bound) {
  return _mm512_cmpeq_epu32_mask(k.v, _mm512_set1_epi32(static_cast<int>(bound)));
}

/// Writes the lanes selected by `mask`, in lane order, to idx[0..] and
/// val[0..]. Every variant may write all kWidth entries of each array (the
/// ones past popcount(mask) hold junk): callers leave that much room and
/// overwrite the junk with later entries. (A compress straight to memory is
/// several times slower on Intel cores than this one in registers and a
/// full store.)
inline void compress_store(std::uint32_t mask, Words index, Values x, std::uint32_t* idx, float* val) {
  const auto m = static_cast<__mmask16>(mask);
  _mm512_storeu_si512(idx, _mm512_maskz_compress_epi32(m, index.v));
  _mm512_storeu_ps(val, _mm512_maskz_compress_ps(m, x.v));
}

#elif defined(__AVX2__)

inline constexpr const char* kIsa = "AVX2";

struct Values {
  __m256 lo, hi;
};
struct Words {
  __m256i lo, hi;
};

inline Values load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, Values x) {
  _mm256_storeu_ps(p, x.lo);
  _mm256_storeu_ps(p + 8, x.hi);
}
inline Values add(Values a, Values b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Words load(const std::uint32_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8))};
}
inline Words iota(std::uint32_t base) {
  const __m256i lo = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(base)));
  return {lo, _mm256_add_epi32(lo, _mm256_set1_epi32(8))};
}

inline __m256i keys8(__m256 v) {
  const __m256i a = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));  // a < 2^31: signed compare is exact
  return _mm256_or_si256(a, _mm256_srli_epi32(nan, 1));  // a | 0x7FFFFFFF = 0x7FFFFFFF
}
inline Words keys(Values x) { return {keys8(x.lo), keys8(x.hi)}; }

// Keys are below 2^31, so signed 32-bit compares order them exactly; the
// sign bit of each lane becomes one mask bit.
inline std::uint32_t movemask(__m256i lo, __m256i hi) {
  const auto lo8 = static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(lo)));
  const auto hi8 = static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(hi)));
  return lo8 | hi8 << 8;
}
inline std::uint32_t mask_gt(Words k, std::uint32_t bound) {
  const __m256i b = _mm256_set1_epi32(static_cast<int>(bound));  // bound < 2^31 too: topk_key values only
  return movemask(_mm256_cmpgt_epi32(k.lo, b), _mm256_cmpgt_epi32(k.hi, b));
}
inline std::uint32_t mask_eq(Words k, std::uint32_t bound) {
  const __m256i b = _mm256_set1_epi32(static_cast<int>(bound));
  return movemask(_mm256_cmpeq_epi32(k.lo, b), _mm256_cmpeq_epi32(k.hi, b));
}
inline std::uint32_t mask_ge(Words k, std::uint32_t bound) {
  // key >= bound  <=>  key > bound - 1, with bound - 1 = -1 for bound 0 (every key is >= 0).
  const __m256i b = _mm256_set1_epi32(static_cast<int>(bound) - 1);
  return movemask(_mm256_cmpgt_epi32(k.lo, b), _mm256_cmpgt_epi32(k.hi, b));
}

/// kLeftPack[m]: byte j is the lane of the j-th set bit of the 8-bit mask m
/// (lanes past the last set bit: 0). 2 KiB, stays in L1.
inline constexpr std::array<std::uint64_t, 256> kLeftPack = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned j = 0;
    for (unsigned lane = 0; lane < 8; ++lane)
      if (m >> lane & 1u) t[m] |= std::uint64_t{lane} << (8 * j++);
  }
  return t;
}();

inline __m256i left_pack(std::uint32_t mask8) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kLeftPack[mask8])));
}

inline void compress_store(std::uint32_t mask, Words index, Values x, std::uint32_t* idx, float* val) {
  const __m256i plo = left_pack(mask & 0xFFu), phi = left_pack(mask >> 8);
  const std::size_t nlo = popcount(mask & 0xFFu);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx), _mm256_permutevar8x32_epi32(index.lo, plo));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + nlo), _mm256_permutevar8x32_epi32(index.hi, phi));
  _mm256_storeu_ps(val, _mm256_permutevar8x32_ps(x.lo, plo));
  _mm256_storeu_ps(val + nlo, _mm256_permutevar8x32_ps(x.hi, phi));
}

#else  // portable: what g++ makes of plain loops

inline constexpr const char* kIsa = "portable";

struct Values {
  float v[kWidth];
};
struct Words {
  std::uint32_t v[kWidth];
};

inline Values load(const float* p) {
  Values x;
  for (std::size_t b = 0; b < kWidth; ++b) x.v[b] = p[b];
  return x;
}
inline void store(float* p, Values x) {
  for (std::size_t b = 0; b < kWidth; ++b) p[b] = x.v[b];
}
inline Values add(Values a, Values b) {
  for (std::size_t l = 0; l < kWidth; ++l) a.v[l] += b.v[l];
  return a;
}
inline Words load(const std::uint32_t* p) {
  Words x;
  for (std::size_t b = 0; b < kWidth; ++b) x.v[b] = p[b];
  return x;
}
inline Words iota(std::uint32_t base) {
  Words x;
  for (std::size_t b = 0; b < kWidth; ++b) x.v[b] = base + static_cast<std::uint32_t>(b);
  return x;
}
inline Words keys(Values x) {
  Words k;
  for (std::size_t b = 0; b < kWidth; ++b) k.v[b] = topk_key(x.v[b]);
  return k;
}
template <class Pred>
std::uint32_t mask_if(Words k, Pred pred) {
  std::uint32_t m = 0;
  for (std::size_t b = 0; b < kWidth; ++b) m |= static_cast<std::uint32_t>(pred(k.v[b])) << b;
  return m;
}
inline std::uint32_t mask_ge(Words k, std::uint32_t bound) {
  return mask_if(k, [=](std::uint32_t key) { return key >= bound; });
}
inline std::uint32_t mask_gt(Words k, std::uint32_t bound) {
  return mask_if(k, [=](std::uint32_t key) { return key > bound; });
}
inline std::uint32_t mask_eq(Words k, std::uint32_t bound) {
  return mask_if(k, [=](std::uint32_t key) { return key == bound; });
}
inline void compress_store(std::uint32_t mask, Words index, Values x, std::uint32_t* idx, float* val) {
  for (std::size_t out = 0; mask != 0; mask &= mask - 1, ++out) {  // one step per selected lane
    const auto b = static_cast<std::size_t>(std::countr_zero(mask));
    idx[out] = index.v[b];
    val[out] = x.v[b];
  }
}

#endif

/// A line of 16-bit gradient elements, widened to float (kernels/element.h).
template <class G>
inline Values load(const G* p) {
  alignas(64) float f[kWidth];
  for (std::size_t b = 0; b < kWidth; ++b) f[b] = to_float(p[b]);
  return load(static_cast<const float*>(f));
}

}  // namespace gz::kernels::cpu::topk_line

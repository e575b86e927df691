// CPU loops of the none, fp16 and bf16 codecs.
//
// The portable loops call the element functions of kernels/cast.h. Where the
// build targets AVX2 (+F16C for fp16) one 8-lane loop serves both formats,
// each supplying only its 8-lane conversion; tests/codecs/cast_test.cc checks
// that it gives the same bits as the element functions on every rounding
// boundary, saturation and NaN case. (g++ does vectorize the portable loops,
// but the 32->16-bit packing it emits is about a third slower.)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cast.h"
#include "kernels/cpu.h"
#include "kernels/cpu_loops.h"
#include "kernels/error_feedback.h"

#if defined(__SSE2__) && !defined(__AVX2__)
#include <immintrin.h>  // stream_store's SSE2 stores (cpu_loops.h includes it under AVX2)
#endif

namespace gz::kernels::cpu {

template <class G>
void copy_encode(const G* g, float* r, std::size_t n, float* out) {
  if (!r) {
    if constexpr (std::is_same_v<G, float>) {
      if (n) std::memcpy(out, g, n * sizeof(float));  // g may be null when n == 0
    } else {
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(g[i]);
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float v = detail::input<true>(g, r, i);
    out[i] = v;
    r[i] = ef_residual(v, v);  // 0, or dropped when v is not finite
  }
}

void copy_decode(const float* in, std::size_t begin, std::size_t end, float* out, Combine c) {
  const float* src = in + begin;
  with_combine(c, [&](auto acc, auto scaled) {
    for (std::size_t i = 0; i < end - begin; ++i) out[i] = combine<acc, scaled>(out[i], src[i], c.scale);
  });
}

void sum(const float* const* in, std::size_t m, std::size_t n, float scale, float* out) {
  if (m == 0 || n == 0) return;
  // Tiles small enough to stay in L1: each input is read once, out written
  // once, and the running sum lives in `acc` (out may alias an input).
  constexpr std::size_t kTile = 2048;
  alignas(64) float acc[kTile];
  for (std::size_t b = 0; b < n; b += kTile) {
    const std::size_t len = std::min(kTile, n - b);
    for (std::size_t j = 0; j < m; ++j)
      copy_decode(in[j] + b, 0, len, acc, Combine{j > 0, j + 1 == m ? scale : 1.0f});
    stream_store(acc, len, out + b);
  }
}

void stream_store(const float* src, std::size_t n, float* dst) {
#if defined(__SSE2__)
  std::size_t i = 0;
  for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 15u) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
#else
  if (n) std::memcpy(dst, src, n * sizeof(float));
#endif
}

namespace {

using namespace detail;

template <class Fmt, bool kEf, class G>
void encode_portable(const G* g, float* r, std::size_t begin, std::size_t end, std::uint16_t* out) {
  for (std::size_t i = begin; i < end; ++i) {
    const float v = input<kEf>(g, r, i);
    const std::uint16_t h = Fmt::encode(v);
    out[i] = h;
    if constexpr (kEf) r[i] = ef_residual(v, Fmt::decode(h));
  }
}

template <class Fmt, bool kAcc, bool kScaled>
void decode_portable(const std::uint16_t* in, std::size_t begin, std::size_t end, float* out, float scale) {
  for (std::size_t i = begin; i < end; ++i) out[i] = combine<kAcc, kScaled>(out[i], Fmt::decode(in[i]), scale);
}

#if GZ_CPU_AVX2
/// saturate_finite on 8 lanes.
__m256 saturate8(__m256 v, float lim) {
  const __m256 clamped = _mm256_max_ps(_mm256_set1_ps(-lim), _mm256_min_ps(_mm256_set1_ps(lim), v));
  return _mm256_blendv_ps(clamped, v, nonfinite_mask(v));
}

/// The 8-lane twins of HalfFormat / BFloat16Format encode and decode; round
/// is the plain IEEE conversion (round to nearest even, overflow to inf),
/// which encode applies after the codecs' saturation and narrow as it is.
template <class Fmt>
struct Lanes8;

#if defined(__F16C__)
template <>
struct Lanes8<HalfFormat> {
  static constexpr bool available = true;
  static __m128i round(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m128i encode(__m256 v) { return round(saturate8(v, kHalfMax)); }
  static __m256 decode(__m128i h) { return _mm256_cvtph_ps(h); }
};
#else
template <>
struct Lanes8<HalfFormat> {
  static constexpr bool available = false;
};
#endif

template <>
struct Lanes8<BFloat16Format> {
  static constexpr bool available = true;
  static __m128i encode(__m256 v) { return round(saturate8(v, kBf16Max)); }
  static __m128i round(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i h32 = _mm256_blendv_epi8(rounded, quiet, is_nan);
    // 8 x u32 (< 2^16) -> 8 x u16: pack within 128-bit halves, then gather the halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h32, h32), 0xD8);
    return _mm256_castsi256_si128(packed);
  }
  static __m256 decode(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
};

template <class Fmt, bool kEf, class G>
void encode_avx2(const G* g, float* r, std::size_t n, std::uint16_t* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead, 1);
    const __m256 v = input8<kEf>(g, r, i);
    const __m128i h = Lanes8<Fmt>::encode(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    if constexpr (kEf) _mm256_storeu_ps(r + i, ef_residual8(v, Lanes8<Fmt>::decode(h)));
  }
  encode_portable<Fmt, kEf>(g, r, i, n, out);
}

/// combine<kAcc, kScaled> on 8 lanes.
template <bool kAcc, bool kScaled>
__m256 combine8(const float* out, __m256 d, __m256 scale) {
  const __m256 v = kAcc ? _mm256_add_ps(_mm256_loadu_ps(out), d) : d;
  return kScaled ? _mm256_mul_ps(v, scale) : v;
}

template <class Fmt, bool kAcc, bool kScaled>
void decode_avx2(const std::uint16_t* in, std::size_t begin, std::size_t end, float* out, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __builtin_prefetch(out + i + kPrefetchAhead, 1);
    const __m256 d = Lanes8<Fmt>::decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, combine8<kAcc, kScaled>(out + i, d, s));
  }
  decode_portable<Fmt, kAcc, kScaled>(in, i, end, out, scale);
}
#endif  // GZ_CPU_AVX2

}  // namespace

template <class Fmt, class G>
void cast_encode(const G* g, float* r, std::size_t n, std::uint16_t* out) {
#if GZ_CPU_AVX2
  if constexpr (Lanes8<Fmt>::available) {
    if (r)
      encode_avx2<Fmt, true>(g, r, n, out);
    else
      encode_avx2<Fmt, false>(g, r, n, out);
    return;
  }
#endif
  if (r)
    encode_portable<Fmt, true>(g, r, 0, n, out);
  else
    encode_portable<Fmt, false>(g, r, 0, n, out);
}

template <class Fmt>
void cast_decode(const std::uint16_t* in, std::size_t begin, std::size_t end, float* out, Combine c) {
  const std::uint16_t* src = in + begin;
  const std::size_t n = end - begin;
  with_combine(c, [&](auto acc, auto scaled) {
#if GZ_CPU_AVX2
    if constexpr (Lanes8<Fmt>::available) {
      decode_avx2<Fmt, acc, scaled>(src, 0, n, out, c.scale);
      return;
    }
#endif
    decode_portable<Fmt, acc, scaled>(src, 0, n, out, c.scale);
  });
}

template <class T>
void widen(const T* in, std::size_t n, float* out) {
  std::size_t i = 0;
#if GZ_CPU_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, detail::load8(in + i));
#endif
  for (; i < n; ++i) out[i] = to_float(in[i]);
}

template <class T>
void narrow(const float* in, std::size_t n, T* out) {
  std::size_t i = 0;
#if GZ_CPU_AVX2
  if constexpr (!std::is_same_v<T, float>) {
    using Fmt = std::conditional_t<std::is_same_v<T, Half>, HalfFormat, BFloat16Format>;
    if constexpr (Lanes8<Fmt>::available)
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Lanes8<Fmt>::round(_mm256_loadu_ps(in + i)));
  }
#endif
  for (; i < n; ++i) out[i] = from_float<T>(in[i]);
}

#define GZ_INSTANTIATE(G)                                                             \
  template void widen(const G*, std::size_t, float*);                                 \
  template void narrow(const float*, std::size_t, G*);                                \
  template void copy_encode(const G*, float*, std::size_t, float*);                   \
  template void cast_encode<HalfFormat>(const G*, float*, std::size_t, std::uint16_t*); \
  template void cast_encode<BFloat16Format>(const G*, float*, std::size_t, std::uint16_t*);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE
template void cast_decode<HalfFormat>(const std::uint16_t*, std::size_t, std::size_t, float*, Combine);
template void cast_decode<BFloat16Format>(const std::uint16_t*, std::size_t, std::size_t, float*, Combine);

}  // namespace gz::kernels::cpu

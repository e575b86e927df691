// CPU loops of the none, fp16 and bf16 codecs. Every loop is written so that
// g++ -O3 vectorizes it (checked with -fopt-info-vec; see kernels/README.md).
// fp16 uses the F16C conversion instructions when the build targets them;
// kernels/cast.h is the portable twin and gives the same bits
// (tests/test_cast.cc checks this on every binary16 boundary).
#include <cstring>
#include <type_traits>

#include "kernels/cast.h"
#include "kernels/cpu.h"
#include "kernels/error_feedback.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define GZ_CPU_F16C 1
#endif

namespace gz::kernels::cpu {

void copy_encode(const float* g, float* r, std::size_t n, float* out) {
  if (!r) {
    std::memcpy(out, g, n * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float v = g[i] + r[i];
    out[i] = v;
    r[i] = ef_residual(v, v);  // 0, or dropped when v is not finite
  }
}

void add_accumulate(const float* in, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
}

void scale(float* out, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i) out[i] *= alpha;
}

namespace {

template <class Fmt, bool kEf>
void cast_encode_portable(const float* g, float* r, std::size_t begin, std::size_t end, std::uint16_t* out) {
  for (std::size_t i = begin; i < end; ++i) {
    const float v = kEf ? g[i] + r[i] : g[i];
    const std::uint16_t h = Fmt::encode(v);
    out[i] = h;
    if constexpr (kEf) r[i] = ef_residual(v, Fmt::decode(h));
  }
}

#if GZ_CPU_F16C
// 8 lanes of HalfFormat::encode: saturate finite values, convert with RNE.
template <bool kEf>
void half_encode_f16c(const float* g, float* r, std::size_t n, std::uint16_t* out) {
  const __m256 lim = _mm256_set1_ps(kHalfMax);
  const __m256 neg_lim = _mm256_set1_ps(-kHalfMax);
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(g + i);
    if constexpr (kEf) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    const __m256i vb = _mm256_castps_si256(v);
    const __m256 nonfinite = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(vb, exp_mask), exp_mask));
    const __m256 clamped = _mm256_max_ps(neg_lim, _mm256_min_ps(lim, v));
    const __m256 sat = _mm256_blendv_ps(clamped, v, nonfinite);
    const __m128i h = _mm256_cvtps_ph(sat, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    if constexpr (kEf) {
      const __m256 res = _mm256_sub_ps(v, _mm256_cvtph_ps(h));
      const __m256i rb = _mm256_castps_si256(res);
      const __m256 bad = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(rb, exp_mask), exp_mask));
      _mm256_storeu_ps(r + i, _mm256_andnot_ps(bad, res));
    }
  }
  cast_encode_portable<HalfFormat, kEf>(g, r, i, n, out);
}

void half_decode_f16c(const std::uint16_t* in, std::size_t n, float* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), d));
  }
  for (; i < n; ++i) out[i] += half_to_float(in[i]);
}
#endif

}  // namespace

template <class Fmt>
void cast_encode(const float* g, float* r, std::size_t n, std::uint16_t* out) {
#if GZ_CPU_F16C
  if constexpr (std::is_same_v<Fmt, HalfFormat>) {
    if (r)
      half_encode_f16c<true>(g, r, n, out);
    else
      half_encode_f16c<false>(g, r, n, out);
    return;
  }
#endif
  if (r)
    cast_encode_portable<Fmt, true>(g, r, 0, n, out);
  else
    cast_encode_portable<Fmt, false>(g, r, 0, n, out);
}

template <class Fmt>
void cast_decode_accumulate(const std::uint16_t* in, std::size_t n, float* out) {
#if GZ_CPU_F16C
  if constexpr (std::is_same_v<Fmt, HalfFormat>) {
    half_decode_f16c(in, n, out);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] += Fmt::decode(in[i]);
}

template void cast_encode<HalfFormat>(const float*, float*, std::size_t, std::uint16_t*);
template void cast_encode<BFloat16Format>(const float*, float*, std::size_t, std::uint16_t*);
template void cast_decode_accumulate<HalfFormat>(const std::uint16_t*, std::size_t, float*);
template void cast_decode_accumulate<BFloat16Format>(const std::uint16_t*, std::size_t, float*);

}  // namespace gz::kernels::cpu

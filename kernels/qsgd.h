// Per-element math of qsgd: B-bit max-min quantization per bucket (QSGD,
// Alistarh et al. 2017, with the max-min scaling of CGX, Markov et al. 2022).
//
// Each bucket of S consecutive values v (already v = g + r) sends
//   lo   = min(v) and unit = (max(v) - min(v)) / L, with L = 2^B - 1 levels,
//   q_i  = the level of v_i, in 0..L:  round((v_i - lo) / unit)  (nearest), or
//          floor((v_i - lo) / unit + u_i) with u_i uniform in [0, 1) from
//          Philox keyed by (seed, step) at element i (stochastic: unbiased),
// and decodes v_i as lo + q_i * unit.
//
// Written so that every implementation gives the same bits:
//   - values are clamped to +-2^126 first, so max - min cannot overflow (error
//     feedback carries what the clamp took, as for fp16's saturation);
//   - min and max are exact in any order; -0 is made +0 before use;
//   - (v - lo) is multiplied by inv = 1 / unit, computed once per bucket (a
//     unit below FLT_MIN sends every element at lo: inv = 0);
//   - a bucket holding inf or NaN sends lo = unit = NaN and every q = 0, so
//     the whole bucket decodes to NaN (loss scalers see it; EF drops it).
//
// Wire body (qsgd_param: bits B in the header param's top byte, bucket size S
// below): ceil(n/S) x {f32 lo, f32 unit}, then the codes as a little-endian
// bit stream, B bits per element (element i at bits [iB, iB+B)), padded with
// zero bits to whole u32 words. 32 elements fill exactly B words.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "kernels/cuda.h"
#include "kernels/hd.h"
#include "kernels/philox.h"

namespace gz::kernels {

inline constexpr std::uint32_t kQsgdDefaultBits = 4;
inline constexpr std::uint32_t kQsgdDefaultBucket = 512;
inline constexpr std::uint32_t kQsgdMinBits = 2, kQsgdMaxBits = 8;
inline constexpr std::uint32_t kQsgdMaxBucket = (1u << 24) - 1;
/// Values are clamped to +-kQsgdClamp before quantization.
inline constexpr float kQsgdClamp = 0x1p126f;
/// The NaN a non-finite bucket sends (one bit pattern on every platform).
inline constexpr std::uint32_t kQsgdNaNBits = 0x7FC00000u;

GZ_HD std::uint32_t qsgd_param(std::uint32_t bits, std::uint32_t bucket) { return bits << 24 | bucket; }
GZ_HD std::uint32_t qsgd_bits(std::uint32_t param) { return param >> 24; }
GZ_HD std::uint32_t qsgd_bucket(std::uint32_t param) { return param & 0xFFFFFFu; }
GZ_HD std::uint32_t qsgd_levels(std::uint32_t bits) { return (1u << bits) - 1u; }

/// A bucket's scale, as it travels on the wire.
struct QsgdScale {
  float lo;    ///< the level-0 value
  float unit;  ///< the step between levels
};

struct QsgdLayout {
  /// 0 when a header param is valid; 1: bits outside 2..8; 2: bucket size 0.
  GZ_HD static std::uint32_t check_param(std::uint32_t param, std::uint64_t) {
    const std::uint32_t b = qsgd_bits(param);
    if (b < kQsgdMinBits || b > kQsgdMaxBits) return 1;
    return qsgd_bucket(param) == 0 ? 2u : 0u;
  }
  GZ_HD static std::uint64_t buckets(std::uint32_t param, std::uint64_t count) {
    const std::uint32_t s = qsgd_bucket(param);
    return (count + s - 1) / s;
  }
  /// Offset of the code words.
  GZ_HD static std::uint64_t words_offset(std::uint32_t param, std::uint64_t count) {
    return 8 * buckets(param, count);
  }
  GZ_HD static std::uint64_t words(std::uint32_t param, std::uint64_t count) {
    return (count * qsgd_bits(param) + 31) / 32;
  }
  GZ_HD static std::uint64_t body_bytes(std::uint32_t param, std::uint64_t count) {
    return words_offset(param, count) + 4 * words(param, count);
  }
};

/// A value as quantization sees it: clamped to +-kQsgdClamp (NaN passes).
GZ_HD float qsgd_clamp(float v) { return select(v > kQsgdClamp, kQsgdClamp, select(v < -kQsgdClamp, -kQsgdClamp, v)); }

/// The bucket's scale from the min and max of its clamped values.
GZ_HD QsgdScale qsgd_scale(float lo, float hi, bool nonfinite, std::uint32_t bits) {
  if (nonfinite) return QsgdScale{bits_float(kQsgdNaNBits), bits_float(kQsgdNaNBits)};
  const float l = static_cast<float>(qsgd_levels(bits));
  lo = lo + 0.0f;  // -0 -> +0: min/max may return either zero
  hi = hi + 0.0f;
  return QsgdScale{lo, hi / l - lo / l};  // no overflow: |lo|, |hi| <= 2^126
}

/// 1 / unit, or 0 when the unit is below FLT_MIN (or NaN): then every level is 0.
GZ_HD float qsgd_inverse(float unit) { return unit >= 0x1p-126f ? 1.0f / unit : 0.0f; }

/// The level of a value: dither 0.5 rounds to nearest, a uniform draw in [0, 1)
/// rounds stochastically. NaN (a non-finite bucket) gives 0.
GZ_HD std::uint32_t qsgd_level(float v, QsgdScale s, float inv, float dither, std::uint32_t levels) {
  const float y = (qsgd_clamp(v) - s.lo) * inv + dither;
  const float top = static_cast<float>(levels);
  const float c = select(y > 0.0f, select(y < top, y, top), 0.0f);  // in [0, L]; NaN -> 0
  return static_cast<std::uint32_t>(c);
}

/// The value a level decodes to.
GZ_HD float qsgd_value(std::uint32_t q, QsgdScale s) { return s.lo + static_cast<float>(q) * s.unit; }

/// The dither of element i: 0.5 (nearest) or its Philox draw (stochastic).
GZ_HD float qsgd_dither(bool stochastic, std::uint32_t seed, std::uint64_t step, std::uint64_t i) {
  return stochastic ? philox_uniform(seed, step, i) : 0.5f;
}

/// Level of element i from the code stream (B bits at bit i*B; may straddle two words).
GZ_HD std::uint32_t qsgd_code_at(const std::uint32_t* words, std::uint64_t i, std::uint32_t bits) {
  const std::uint64_t p = i * bits;
  const std::uint64_t w = p / 32;
  const unsigned shift = static_cast<unsigned>(p % 32);
  std::uint64_t x = words[w];
  if (shift + bits > 32) x |= static_cast<std::uint64_t>(words[w + 1]) << 32;
  return static_cast<std::uint32_t>(x >> shift) & qsgd_levels(bits);
}

/// What stochastic rounding needs besides the values: on or off, and the key.
struct QsgdRounding {
  bool stochastic = false;
  std::uint32_t seed = 0;
  std::uint64_t step = 0;
};

// ---- the loops (conventions: kernels/cpu.h, kernels/cuda.h) -----------------

namespace cpu {
/// scales: QsgdLayout::buckets entries; words: QsgdLayout::words, any contents
/// (every word is written). bits in 2..8, bucket >= 1.
template <class G>
void qsgd_encode(const G* g, float* r, std::size_t n, std::uint32_t bits, std::uint32_t bucket,
                 const QsgdRounding& rounding, QsgdScale* scales, std::uint32_t* words);
/// Elements [begin, end) into out[0 .. end - begin), combined as `c` says.
void qsgd_decode(const QsgdScale* scales, const std::uint32_t* words, std::uint32_t bits, std::uint32_t bucket,
                 std::size_t begin, std::size_t end, float* out, Combine c);
}  // namespace cpu

namespace cuda {
/// The twin of cpu::qsgd_encode. bucket % 32 == 0 runs one fused pass (a warp
/// per bucket: min/max by shuffles, codes OR-reduced into words, residual);
/// other bucket sizes take two passes (scales, then a warp per 32 elements).
template <class G>
void qsgd_encode(const G* g, float* r, std::size_t n, std::uint32_t bits, std::uint32_t bucket,
                 const QsgdRounding& rounding, QsgdScale* scales, std::uint32_t* words, const Blob32& head,
                 Stream stream);
void qsgd_decode(const QsgdScale* scales, const std::uint32_t* words, std::size_t n, std::uint32_t bits,
                 std::uint32_t bucket, const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream);
}  // namespace cuda

}  // namespace gz::kernels

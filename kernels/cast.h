// Per-element math of the fp16 and bf16 codecs: float -> 16-bit with
// round-to-nearest-even, and back. Integer-only, so the host, the device and
// the F16C fast path (kernels/cast_cpu.cc) agree bit for bit.
//
// Overflow policy: a finite value saturates to the largest finite 16-bit value
// (error feedback carries the excess to the next step); inf and NaN pass
// through (NaN stays NaN, quieted, keeping its top payload bits), so loss
// scalers still see them.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace gz::kernels {

/// Largest finite binary16 value.
inline constexpr float kHalfMax = 0x1.FFCp15f;  // 65504
/// Largest finite bfloat16 value (0x7F7F).
inline constexpr float kBf16Max = 0x1.FEp127f;  // bits 0x7F7F0000

/// IEEE binary16 encoding of `f`, round-to-nearest-even, inf on overflow.
GZ_HD std::uint16_t half_from_float_rne(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // normal binary16: rebias the exponent (127 -> 15), round 13 bits away
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: rounds to zero
  // Subnormal binary16: count units of 2^-24, rounding the shifted-out bits.
  const std::uint32_t e = a >> 23;                      // 102..112
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;  // implicit bit
  const std::uint32_t shift = 126u - e;                 // 14..24
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  const std::uint32_t up = (rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (q + up));
}

/// Exact float value of a binary16 encoding (NaN is quieted).
GZ_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m ? (0x400000u | (m << 13)) : 0u));
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in float
  const float mag = static_cast<float>(m) * 5.9604644775390625e-8f;
  return bits_float(sign | float_bits(mag));
}

/// bfloat16 encoding of `f`, round-to-nearest-even, inf on overflow.
GZ_HD std::uint16_t bf16_from_float_rne(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

GZ_HD float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

/// Clamps a finite value into [-lim, lim]; inf and NaN are returned unchanged.
GZ_HD float saturate_finite(float v, float lim) {
  if (is_nonfinite(v)) return v;
  return v > lim ? lim : (v < -lim ? -lim : v);
}

/// The two 16-bit formats as codec traits: encode() applies the overflow policy.
struct HalfFormat {
  static constexpr const char* name = "fp16";
  static constexpr float max_finite = kHalfMax;
  GZ_HD static std::uint16_t encode(float v) { return half_from_float_rne(saturate_finite(v, kHalfMax)); }
  GZ_HD static float decode(std::uint16_t h) { return half_to_float(h); }
};

struct BFloat16Format {
  static constexpr const char* name = "bf16";
  static constexpr float max_finite = kBf16Max;
  GZ_HD static std::uint16_t encode(float v) { return bf16_from_float_rne(saturate_finite(v, kBf16Max)); }
  GZ_HD static float decode(std::uint16_t b) { return bf16_to_float(b); }
};

/// Wire body of a codec that sends every element in `kBytes` bytes (none: f32,
/// fp16/bf16: u16), in element order. The header param is unused (0).
template <unsigned kBytes>
struct DenseLayout {
  /// 0 when a header param is valid for `count` elements; else why not (1: not 0).
  GZ_HD static std::uint32_t check_param(std::uint32_t param, std::uint64_t) { return param != 0 ? 1u : 0u; }
  GZ_HD static std::uint64_t body_bytes(std::uint32_t, std::uint64_t count) { return kBytes * count; }
};
using NoneLayout = DenseLayout<4>;
using CastLayout = DenseLayout<2>;

}  // namespace gz::kernels

// Per-element math of fp8: 8-bit floats with a per-block scale.
//
// Each block of S values v (already v = g + r) sends
//   scale  = amax / F, amax the block's largest finite |v|, F the format's
//            largest finite value (so amax maps to F: the whole range is used),
//   code_i = v_i * (F / amax) as an 8-bit float, rounded to nearest even,
//            saturating: a finite value never becomes inf or NaN,
// and decodes v_i as value(code_i) * scale. The formats are OCP 8-bit floats
// as NCCL (2.24+) reduces them and MS-AMP / Transformer Engine use them:
//   e4m3 (Fp8E4M3): bias 7, 3 mantissa bits, largest 448, no inf; NaN S.1111.111
//   e5m2 (Fp8E5M2): bias 15, 2 mantissa bits, largest 57344, inf S.11111.00
// Non-finite inputs stay non-finite: NaN sends NaN; inf sends inf (e5m2) or
// NaN (e4m3, which has no inf); they do not count towards amax, so the rest of
// the block is unaffected. NaN codes carry no sign or payload (0x7F for e4m3,
// 0x7E for e5m2): one bit pattern on every platform. A block whose amax is
// below 2^-100 sends scale 0 and zero codes: F / amax would overflow, and the
// residual keeps such values exactly.
//
// The conversions are integer and float-add operations that every platform
// rounds the same way (no FMA, no hardware fp8 unit), so the CPU lanes of
// kernels/fp8_cpu.cc and the CUDA kernels give these bits exactly.
//
// Wire body (fp8_param: exponent bits 4 or 5 in the header param's top byte,
// block size S below): ceil(n/S) x f32 scale, then n code bytes, padded with
// zero bytes to a multiple of 4.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "kernels/cuda.h"
#include "kernels/hd.h"

namespace gz::kernels {

inline constexpr std::uint32_t kFp8DefaultBlock = 512;
inline constexpr std::uint32_t kFp8MaxBlock = (1u << 24) - 1;
/// Blocks whose largest |v| is below this send zeros (F / amax must stay finite).
inline constexpr float kFp8MinAmax = 0x1p-100f;

/// One OCP 8-bit float format, from its exponent and mantissa widths.
template <int kExp, int kMan>
struct Fp8Format {
  static constexpr int exp_bits = kExp, man_bits = kMan;
  static constexpr int bias = (1 << (kExp - 1)) - 1;
  /// e4m3 spends its top code on NaN and has no inf; e5m2 is IEEE-like.
  static constexpr bool has_inf = kExp == 5;
  static constexpr std::uint32_t max_code = has_inf ? 0x7Bu : 0x7Eu;
  static constexpr std::uint32_t nan_code = has_inf ? 0x7Eu : 0x7Fu;
  static constexpr std::uint32_t inf_code = 0x7Cu;  // e5m2 only
  /// Largest finite value: 1.75 * 2^(top exponent - bias): 448 or 57344.
  static constexpr float max_finite = has_inf ? 57344.0f : 448.0f;
  /// Smallest normal magnitude's float bits, 2^(1 - bias).
  static constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(127 + 1 - bias) << 23;
  /// Subnormals count units of 2^(1 - bias - man): adding this float rounds |x| to a multiple of one.
  static constexpr float subnormal_magic = static_cast<float>(1u << (23 + 1 - bias - kMan));

  /// The code of x: round to nearest even, saturating; NaN -> nan_code, inf -> inf (e5m2) / NaN (e4m3).
  GZ_HD static std::uint32_t encode(float x) {
    const std::uint32_t bits = float_bits(x);
    const std::uint32_t sign = (bits >> 24) & 0x80u;
    const std::uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return nan_code;
    if (a == 0x7F800000u) return has_inf ? (sign | inf_code) : nan_code;
    std::uint32_t code;
    if (a >= min_normal_bits) {  // rebias the exponent, round the mantissa to kMan bits (ties to even)
      const std::uint32_t r = a - (static_cast<std::uint32_t>(127 - bias) << 23);
      code = (r + ((1u << (22 - kMan)) - 1u) + ((r >> (23 - kMan)) & 1u)) >> (23 - kMan);
      code = code < max_code ? code : max_code;
    } else {  // subnormal (or zero): |x| + magic rounds to a whole number of units (ties to even)
      code = float_bits(bits_float(a) + subnormal_magic) - float_bits(subnormal_magic);
    }
    return sign | code;
  }

  /// The exact value of a code.
  GZ_HD static float decode(std::uint32_t code) {
    const std::uint32_t sign = (code & 0x80u) << 24;
    const std::uint32_t mag = code & 0x7Fu;
    if (has_inf ? mag > inf_code : mag == nan_code) return bits_float(0x7FC00000u);
    if (has_inf && mag == inf_code) return bits_float(sign | 0x7F800000u);
    if (mag >> kMan) return bits_float(sign | ((mag << (23 - kMan)) + (static_cast<std::uint32_t>(127 - bias) << 23)));
    // subnormal: mag units of 2^(1 - bias - kMan), exact in float
    return bits_float(sign | float_bits(static_cast<float>(mag) * bits_float(static_cast<std::uint32_t>(
                                                                     127 + 1 - bias - kMan) << 23)));
  }
};

using Fp8E4M3 = Fp8Format<4, 3>;
using Fp8E5M2 = Fp8Format<5, 2>;

GZ_HD std::uint32_t fp8_param(std::uint32_t exp_bits, std::uint32_t block) { return exp_bits << 24 | block; }
GZ_HD std::uint32_t fp8_exp_bits(std::uint32_t param) { return param >> 24; }
GZ_HD std::uint32_t fp8_block(std::uint32_t param) { return param & 0xFFFFFFu; }

struct Fp8Layout {
  /// 0 when a header param is valid; 1: exponent bits not 4 or 5; 2: block size 0.
  GZ_HD static std::uint32_t check_param(std::uint32_t param, std::uint64_t) {
    const std::uint32_t e = fp8_exp_bits(param);
    if (e != 4 && e != 5) return 1;
    return fp8_block(param) == 0 ? 2u : 0u;
  }
  GZ_HD static std::uint64_t blocks(std::uint32_t param, std::uint64_t count) {
    const std::uint32_t s = fp8_block(param);
    return (count + s - 1) / s;
  }
  /// Offset of the code bytes.
  GZ_HD static std::uint64_t codes_offset(std::uint32_t param, std::uint64_t count) {
    return 4 * blocks(param, count);
  }
  GZ_HD static std::uint64_t body_bytes(std::uint32_t param, std::uint64_t count) {
    return codes_offset(param, count) + (count + 3) / 4 * 4;
  }
};

/// A block's largest finite |v| grows by this (NaN and inf do not count).
GZ_HD float fp8_amax(float amax, float v) {
  const float a = bits_float(float_bits(v) & 0x7FFFFFFFu);
  return select(!is_nonfinite(v) && a > amax, a, amax);
}

/// Multiplier to the format (F / amax, or 0 for a block below kFp8MinAmax) and the decode scale.
struct Fp8Scale {
  float inv;    ///< v * inv is in the format's range
  float scale;  ///< the wire value: code value * scale decodes
};
template <class Fmt>
GZ_HD Fp8Scale fp8_scale(float amax) {
  if (!(amax >= kFp8MinAmax)) return Fp8Scale{0.0f, 0.0f};
  return Fp8Scale{Fmt::max_finite / amax, amax / Fmt::max_finite};
}

/// The code an input value sends.
template <class Fmt>
GZ_HD std::uint32_t fp8_code(float v, float inv) {
  return Fmt::encode(v * inv);
}

/// The value a code decodes to.
template <class Fmt>
GZ_HD float fp8_value(std::uint32_t code, float scale) {
  return Fmt::decode(code) * scale;
}

// ---- the loops (conventions: kernels/cpu.h, kernels/cuda.h) -----------------

namespace cpu {
/// scales: Fp8Layout::blocks entries; codes: n bytes plus zero padding to a
/// multiple of 4 (written). exp_bits 4 (e4m3) or 5 (e5m2), block >= 1.
template <class G>
void fp8_encode(const G* g, float* r, std::size_t n, std::uint32_t exp_bits, std::uint32_t block, float* scales,
                std::uint8_t* codes);
/// Elements [begin, end) into out[0 .. end - begin), combined as `c` says.
void fp8_decode(const float* scales, const std::uint8_t* codes, std::uint32_t exp_bits, std::uint32_t block,
                std::size_t begin, std::size_t end, float* out, Combine c);
}  // namespace cpu

namespace cuda {
/// The twin of cpu::fp8_encode: a warp per block (amax by shuffles, one byte
/// per lane and element, residual); blocks of up to 512 stay in registers.
template <class G>
void fp8_encode(const G* g, float* r, std::size_t n, std::uint32_t exp_bits, std::uint32_t block, float* scales,
                std::uint8_t* codes, const Blob32& head, Stream stream);
void fp8_decode(const float* scales, const std::uint8_t* codes, std::size_t n, std::uint32_t exp_bits,
                std::uint32_t block, const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream);
}  // namespace cuda

}  // namespace gz::kernels

// fp16 / bf16: the portable conversions against independent references, the
// F16C fast path against the portable one, and the codec's overflow policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cast.h"
#include "kernels/cpu.h"
#include "kernels/error_feedback.h"
#include "test_util.h"

namespace gz {
namespace {

using kernels::bits_float;
using kernels::float_bits;

// Value of a binary16 encoding computed with ldexp (independent of the bit tricks).
double half_reference_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1F) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Nearest binary16 (ties to even) by search over all finite positive encodings.
std::uint16_t half_reference_encode(float f) {
  if (std::isnan(f)) return 0;  // not used for NaN
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  // Finite encodings 0..0x7BFF are increasing in value.
  std::uint16_t lo = 0, hi = 0x7BFF;
  while (lo < hi) {  // largest encoding with value <= a
    const std::uint16_t mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (half_reference_value(mid) <= a) lo = mid; else hi = static_cast<std::uint16_t>(mid - 1);
  }
  if (lo == 0x7BFF) return sign | lo;
  const double below = half_reference_value(lo), above = half_reference_value(static_cast<std::uint16_t>(lo + 1));
  std::uint16_t pick = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) pick = static_cast<std::uint16_t>(lo + 1);
  return sign | pick;
}

// Floats around every binary16 rounding boundary, plus random bit patterns.
std::vector<float> boundary_floats() {
  std::vector<float> v;
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = half_reference_value(static_cast<std::uint16_t>(h));
    const double hi = h + 1 < 0x7C00 ? half_reference_value(static_cast<std::uint16_t>(h + 1)) : 65536.0;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    for (float x : {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) v.push_back(bits_float(rng()));
  for (float x : test::edge_values()) v.push_back(x);
  return v;
}

TEST(Fp16, DecodeMatchesReferenceForAllEncodings) {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float got = kernels::half_to_float(static_cast<std::uint16_t>(h));
    const double want = half_reference_value(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      // Quiet NaN keeping the payload: what F16C produces too.
      ASSERT_EQ(float_bits(got), ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(Fp16, EncodeRoundsToNearestEven) {
  for (float f : boundary_floats()) {
    if (std::isnan(f)) continue;
    ASSERT_EQ(kernels::half_from_float_rne(f), half_reference_encode(f)) << f << " bits " << std::hex << float_bits(f);
  }
}

TEST(Fp16, NaNStaysNaNAndQuiet) {
  for (std::uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FA00000u}) {
    const std::uint16_t h = kernels::half_from_float_rne(bits_float(bits));
    EXPECT_EQ(h & 0x7E00, 0x7E00) << std::hex << bits;
    EXPECT_TRUE(std::isnan(kernels::half_to_float(h)));
  }
}

// The decode loop (AVX2 when the build targets it) in every combine mode
// (kernels/combine.h), over an odd sub-range, against the element functions:
// out = (old + d or d) * scale, elements outside [begin, end) untouched.
template <class Fmt>
void expect_decode_matches_element_function(const std::vector<std::uint16_t>& in) {
  const std::size_t begin = 3, end = in.size() - 5;
  for (const kernels::Combine c : {kernels::Combine{true, 1.0f}, kernels::Combine{false, 1.0f},
                                   kernels::Combine{true, 0.25f}, kernels::Combine{false, 1.0f / 3}}) {
    std::vector<float> old = test::normal(in.size(), 17, 1.0f);
    old[begin] = -0.0f;
    std::vector<float> out = old;
    kernels::cpu::cast_decode<Fmt>(in.data(), begin, end, out.data() + begin, c);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float want = i < begin || i >= end ? old[i] : kernels::combine(old[i], Fmt::decode(in[i]), c);
      ASSERT_TRUE(test::same_float(out[i], want))
          << "i " << i << " accumulate " << c.accumulate << " scale " << c.scale << ": " << out[i] << " vs " << want;
    }
  }
}

// The CPU loop (F16C when the build targets it) gives the same bits as the
// portable element function, including the saturation and NaN cases.
TEST(Fp16, FastPathMatchesPortable) {
  std::vector<float> v = boundary_floats();
  for (std::uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FA00123u, 0x7F800000u, 0xFF800000u})
    v.push_back(bits_float(bits));
  std::vector<std::uint16_t> fast(v.size());
  kernels::cpu::cast_encode<kernels::HalfFormat>(v.data(), nullptr, v.size(), fast.data());
  for (std::size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(fast[i], kernels::HalfFormat::encode(v[i])) << v[i] << " bits " << std::hex << float_bits(v[i]);
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) all[h] = static_cast<std::uint16_t>(h);
  expect_decode_matches_element_function<kernels::HalfFormat>(all);
}

TEST(Fp16, FastPathResidualMatchesPortable) {
  std::vector<float> g = boundary_floats();
  std::vector<float> r = test::normal(g.size(), 5, 1e-3f);
  std::vector<float> r2 = r;
  std::vector<std::uint16_t> fast(g.size());
  kernels::cpu::cast_encode<kernels::HalfFormat>(g.data(), r.data(), g.size(), fast.data());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float v = g[i] + r2[i];
    const std::uint16_t h = kernels::HalfFormat::encode(v);
    ASSERT_EQ(fast[i], h) << i;
    ASSERT_TRUE(test::same_float(r[i], kernels::ef_residual(v, kernels::half_to_float(h)))) << i;
  }
}

TEST(Fp16, SaturatesFiniteOverflowAndCarriesTheRest) {
  auto codec = make_codec("fp16");
  std::vector<float> g = {1e6f, -70000.0f, 65519.0f, INFINITY, -INFINITY, NAN, -0.0f, 1e-40f};
  std::vector<float> r(g.size(), 0.0f);
  const auto e = test::encode(*codec, g, &r);
  const auto d = test::decode(*codec, e, g.size());
  EXPECT_EQ(d[0], 65504.0f);
  EXPECT_EQ(r[0], 1e6f - 65504.0f);
  EXPECT_EQ(d[1], -65504.0f);
  EXPECT_EQ(r[1], -70000.0f + 65504.0f);
  EXPECT_EQ(d[2], 65504.0f);
  EXPECT_EQ(r[2], 15.0f);
  EXPECT_EQ(d[3], INFINITY);  // inf travels (loss scalers must see it) ...
  EXPECT_EQ(r[3], 0.0f);      // ... but is not carried forward
  EXPECT_EQ(d[4], -INFINITY);
  EXPECT_EQ(r[4], 0.0f);
  EXPECT_TRUE(std::isnan(d[5]));
  EXPECT_EQ(r[5], 0.0f);
  EXPECT_EQ(d[6], 0.0f);
  EXPECT_EQ(r[6], 0.0f);
  EXPECT_EQ(d[7], 0.0f);  // below the smallest binary16 subnormal
  EXPECT_EQ(r[7], 1e-40f);
}

std::uint16_t bf16_reference_encode(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t lo = x & 0xFFFF0000u;
  if (std::isinf(f)) return static_cast<std::uint16_t>(x >> 16);
  const double a = static_cast<double>(f);
  const double below = static_cast<double>(bits_float(lo));
  const double above = static_cast<double>(bits_float(lo + 0x10000u));  // away from zero; may be inf
  const double db = std::fabs(a - below), da = std::fabs(above - a);
  if (std::isinf(above) && (x & 0x7FFFFFFFu) >= 0x7F7F8000u) return static_cast<std::uint16_t>((lo + 0x10000u) >> 16);
  if (db < da || (db == da && ((lo >> 16) & 1) == 0)) return static_cast<std::uint16_t>(lo >> 16);
  return static_cast<std::uint16_t>((lo + 0x10000u) >> 16);
}

TEST(Bf16, EncodeRoundsToNearestEven) {
  std::mt19937 rng(11);
  std::vector<std::uint32_t> bits;
  for (int i = 0; i < 500000; ++i) bits.push_back(rng());
  for (std::uint32_t b = 0; b < 0x7F800000u; b += 0x10000u * 97)
    for (std::uint32_t off : {0x7FFFu, 0x8000u, 0x8001u, 0x18000u}) bits.push_back(b + off);
  for (std::uint32_t b : bits) {
    const float f = bits_float(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(kernels::bf16_from_float_rne(f), bf16_reference_encode(f)) << std::hex << b;
  }
}

// The CPU loop (AVX2 when the build targets it) against the element function.
TEST(Bf16, FastPathMatchesPortable) {
  std::mt19937 rng(12);
  std::vector<float> g;
  for (int i = 0; i < 300000; ++i) g.push_back(bits_float(rng()));
  for (std::uint32_t b = 0; b < 0x7F800000u; b += 0x10000u * 89)
    for (std::uint32_t off : {0x7FFFu, 0x8000u, 0x8001u, 0x18000u, 0x80000000u + 0x8000u}) g.push_back(bits_float(b + off));
  for (std::uint32_t bits : {0x7F7F8000u, 0x7F7FFFFFu, 0xFF7F8000u, 0x7F800001u, 0xFFC00001u, 0x7F800000u})
    g.push_back(bits_float(bits));
  std::vector<float> r = test::normal(g.size(), 13, 1e-3f), r_old = r;
  std::vector<std::uint16_t> fast(g.size());
  kernels::cpu::cast_encode<kernels::BFloat16Format>(g.data(), r.data(), g.size(), fast.data());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float v = g[i] + r_old[i];
    const std::uint16_t h = kernels::BFloat16Format::encode(v);
    ASSERT_EQ(fast[i], h) << std::hex << kernels::float_bits(v);
    ASSERT_TRUE(test::same_float(r[i], kernels::ef_residual(v, kernels::bf16_to_float(h)))) << i;
  }
  expect_decode_matches_element_function<kernels::BFloat16Format>(fast);
}

TEST(Bf16, SaturatesAndPassesNonFinite) {
  using L = std::numeric_limits<float>;
  EXPECT_EQ(kernels::BFloat16Format::encode(L::max()), 0x7F7F);
  EXPECT_EQ(kernels::BFloat16Format::encode(-L::max()), 0xFF7F);
  EXPECT_EQ(kernels::BFloat16Format::encode(INFINITY), 0x7F80);
  EXPECT_TRUE(std::isnan(kernels::bf16_to_float(kernels::BFloat16Format::encode(NAN))));
  EXPECT_TRUE(std::isnan(kernels::bf16_to_float(kernels::BFloat16Format::encode(bits_float(0x7F800001u)))));
  EXPECT_EQ(kernels::bf16_to_float(kernels::BFloat16Format::encode(1.0f)), 1.0f);
  const float denormal = kernels::bits_float(0x00010000u);  // a bf16-representable subnormal
  EXPECT_EQ(kernels::bf16_to_float(kernels::BFloat16Format::encode(denormal)), denormal);
  EXPECT_EQ(kernels::BFloat16Format::encode(L::denorm_min()), 0x0000);  // rounds to +0
  EXPECT_EQ(float_bits(kernels::bf16_to_float(kernels::BFloat16Format::encode(-0.0f))), 0x80000000u);
}

TEST(Bf16, CodecKeepsOverflowInResidual) {
  auto codec = make_codec("bf16");
  using L = std::numeric_limits<float>;
  std::vector<float> g = {L::max(), 1.00390625f, 3.0f};
  std::vector<float> r(3, 0.0f);
  const auto d = test::decode(*codec, test::encode(*codec, g, &r), 3);
  EXPECT_EQ(d[0], kernels::kBf16Max);
  EXPECT_EQ(r[0], L::max() - kernels::kBf16Max);
  EXPECT_EQ(d[1], 1.0f);  // halfway between 1 and 1+2^-7: ties to even
  EXPECT_EQ(r[1], 0.00390625f);
  EXPECT_EQ(d[2], 3.0f);
  EXPECT_EQ(r[2], 0.0f);
}

// 4 bytes per element for none, 2 for the casts, after the 32-byte header.
TEST(Cast, PayloadSizeFormula) {
  for (std::size_t n : {0u, 1u, 31u, 100000u}) {
    EXPECT_EQ(test::payload_bytes(*make_codec("none"), n), 32 + 4 * n);
    EXPECT_EQ(test::payload_bytes(*make_codec("fp16"), n), 32 + 2 * n);
    EXPECT_EQ(test::payload_bytes(*make_codec("bf16:ef=off"), n), 32 + 2 * n);
  }
}

// Without error feedback the casts still track the sum: one rounding per step
// of values near 1, far below what onebit and topk lose.
TEST(Cast, DriftStaysSmallEvenWithoutFeedback) {
  for (const char* spec : {"fp16:ef=off", "bf16:ef=off"}) {
    auto codec = make_codec(spec);
    EXPECT_LT(test::drift_over_steps(*codec).worst, 6.0) << spec;
  }
}

}  // namespace
}  // namespace gz

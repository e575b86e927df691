// fp8: both formats' conversions against independent references (every code's
// value by ldexp, round to nearest even by search over all codes, saturation,
// inf and NaN), the payload against an independent write-out of kernels/fp8.h
// (the AVX2 lanes included), the edge blocks (zero, tiny, inf/NaN, huge), and
// the size formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "kernels/fp8.h"
#include "test_util.h"

namespace gz {
namespace {

using L = std::numeric_limits<float>;
using kernels::Fp8E4M3;
using kernels::Fp8E5M2;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of a code from its fields with ldexp (OCP FP8; independent of the bit tricks).
template <int kExp, int kMan>
double reference_value(std::uint32_t code) {
  const int bias = (1 << (kExp - 1)) - 1;
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int e = static_cast<int>((code >> kMan) & ((1u << kExp) - 1)), m = static_cast<int>(code & ((1u << kMan) - 1));
  const int top = (1 << kExp) - 1;
  if (kExp == 5 && e == top) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (kExp == 4 && e == top && m == (1 << kMan) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, 1 - bias - kMan);
  return sign * std::ldexp((1 << kMan) + m, e - bias - kMan);
}

// Nearest finite code to x (ties to the even code), saturating at the largest:
// a search over every code (what encode must give for finite x).
template <class Fmt>
std::uint32_t reference_encode(float x) {
  std::uint32_t best = 0;
  double best_err = INFINITY;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= Fmt::max_finite) return (std::signbit(x) ? 0x80u : 0u) | Fmt::max_code;  // saturates
  for (std::uint32_t c = 0; c <= Fmt::max_code; ++c) {
    const double err = std::fabs(reference_value<Fmt::exp_bits, Fmt::man_bits>(c) - ax);
    if (err < best_err || (err == best_err && (c & 1u) == 0)) best = c, best_err = err;
  }
  return (std::signbit(x) ? 0x80u : 0u) | best;
}

template <class Fmt>
void check_decode_all() {
  for (std::uint32_t c = 0; c < 256; ++c) {
    const double want = reference_value<Fmt::exp_bits, Fmt::man_bits>(c);
    const float got = Fmt::decode(c);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
      ASSERT_EQ(bits_of(got), 0x7FC00000u) << "one NaN pattern, code " << c;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "code " << c;
      ASSERT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
}

template <class Fmt>
void check_encode_boundaries() {
  // Every finite code encodes to itself; every midpoint to the even neighbour;
  // a hair on either side of it to the nearer one.
  for (std::uint32_t c = 0; c <= Fmt::max_code; ++c) {
    for (std::uint32_t s : {0u, 0x80u}) {
      const float v = Fmt::decode(s | c);
      ASSERT_EQ(Fmt::encode(v), s | c) << "code " << (s | c);
    }
    if (c == Fmt::max_code) break;
    const double lo = reference_value<Fmt::exp_bits, Fmt::man_bits>(c), hi = reference_value<Fmt::exp_bits, Fmt::man_bits>(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: a few bits wide
    ASSERT_EQ(Fmt::encode(mid), (c & 1u) ? c + 1 : c) << "midpoint above code " << c;
    ASSERT_EQ(Fmt::encode(std::nextafter(mid, 0.0f)), c) << c;
    ASSERT_EQ(Fmt::encode(std::nextafter(mid, INFINITY)), c + 1) << c;
  }
  // Saturation, inf, NaN.
  ASSERT_EQ(Fmt::encode(Fmt::max_finite * 1.06f), Fmt::max_code);
  ASSERT_EQ(Fmt::encode(L::max()), Fmt::max_code);
  ASSERT_EQ(Fmt::encode(-L::max()), 0x80u | Fmt::max_code);
  ASSERT_EQ(Fmt::encode(L::quiet_NaN()), Fmt::nan_code);
  ASSERT_EQ(Fmt::encode(-L::quiet_NaN()), Fmt::nan_code);
  ASSERT_EQ(Fmt::encode(from_bits(0x7F800001u)), Fmt::nan_code);
  ASSERT_EQ(Fmt::encode(L::infinity()), Fmt::has_inf ? 0x7Cu : Fmt::nan_code);
  ASSERT_EQ(Fmt::encode(-L::infinity()), Fmt::has_inf ? 0xFCu : Fmt::nan_code);
  ASSERT_EQ(Fmt::encode(L::denorm_min()), 0u);
  ASSERT_EQ(Fmt::encode(-L::denorm_min()), 0x80u);
  ASSERT_EQ(Fmt::encode(-0.0f), 0x80u);
  // Random finite floats of every magnitude against the search.
  std::mt19937 rng(Fmt::exp_bits);
  std::uniform_int_distribution<std::uint32_t> d(0, 0x7F7FFFFFu);
  for (int k = 0; k < 20000; ++k) {
    std::uint32_t b = d(rng);
    if (k % 2) b = 0x30000000u + b % 0x16000000u;  // half of them near the format's range
    const float x = from_bits(b | (k % 3 == 0 ? 0x80000000u : 0u));
    ASSERT_EQ(Fmt::encode(x), reference_encode<Fmt>(x)) << x;
  }
}

TEST(Fp8E4M3Format, DecodeOfEveryCode) { check_decode_all<Fp8E4M3>(); }
TEST(Fp8E5M2Format, DecodeOfEveryCode) { check_decode_all<Fp8E5M2>(); }
TEST(Fp8E4M3Format, EncodeRoundsToNearestEvenAndSaturates) { check_encode_boundaries<Fp8E4M3>(); }
TEST(Fp8E5M2Format, EncodeRoundsToNearestEvenAndSaturates) { check_encode_boundaries<Fp8E5M2>(); }

TEST(Fp8Format, Constants) {
  EXPECT_EQ(Fp8E4M3::decode(Fp8E4M3::max_code), 448.0f);
  EXPECT_EQ(Fp8E5M2::decode(Fp8E5M2::max_code), 57344.0f);
  EXPECT_EQ(Fp8E4M3::decode(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(Fp8E4M3::decode(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(Fp8E5M2::decode(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(Fp8E5M2::decode(0x01), std::ldexp(1.0f, -16));
  // e5m2 is the top byte of binary16.
  EXPECT_EQ(Fp8E5M2::decode(0x3C), 1.0f);
  EXPECT_EQ(Fp8E4M3::decode(0x38), 1.0f);
}

// ---- the codec ----------------------------------------------------------------

struct Parsed {
  std::uint32_t exp_bits = 0, block = 0;
  std::vector<float> scales;
  std::vector<std::uint8_t> codes;
};

Parsed parse(const test::Encoded& e) {
  const wire::Header h = wire::read_header(e.data(), e.bytes);
  Parsed p;
  p.exp_bits = h.param >> 24;
  p.block = h.param & 0xFFFFFF;
  const std::size_t n = h.count, blocks = (n + p.block - 1) / p.block;
  EXPECT_EQ(h.body_bytes, 4 * blocks + (n + 3) / 4 * 4);
  const std::byte* body = e.data() + wire::kHeaderBytes;
  p.scales.resize(blocks);
  std::memcpy(p.scales.data(), body, 4 * blocks);
  p.codes.resize((n + 3) / 4 * 4);
  std::memcpy(p.codes.data(), body + 4 * blocks, p.codes.size());
  return p;
}

test::Encoded encode(const std::string& spec, const std::vector<float>& g, std::vector<float>* r) {
  auto codec = make_codec(spec);
  test::Encoded e;
  e.storage.assign(codec->max_payload_bytes(g.size()) / 8 + 1, 0xA5A5A5A5A5A5A5A5ull);  // garbage: all must be written
  e.bytes = codec->encode(g.data(), r ? r->data() : nullptr, g.size(), e.data(), codec->max_payload_bytes(g.size()));
  return e;
}

// kernels/fp8.h written out: amax over the finite values, the scale, each code.
template <class Fmt>
void expect_spec(const std::vector<float>& v, std::uint32_t block, const Parsed& got) {
  const double fmax = Fmt::max_finite;
  for (std::size_t begin = 0, b = 0; begin < v.size(); begin += block, ++b) {
    const std::size_t end = std::min(v.size(), begin + block);
    float amax = 0.0f;
    for (std::size_t i = begin; i < end; ++i)
      if (std::isfinite(v[i])) amax = std::max(amax, std::fabs(v[i]));
    const bool tiny = amax < std::ldexp(1.0f, -100);
    const float inv = tiny ? 0.0f : static_cast<float>(fmax) / amax;
    ASSERT_EQ(bits_of(got.scales[b]), bits_of(tiny ? 0.0f : amax / static_cast<float>(fmax))) << "block " << b;
    for (std::size_t i = begin; i < end; ++i) {
      const float x = v[i] * inv;
      const std::uint32_t want = std::isnan(x)   ? Fmt::nan_code
                                 : std::isinf(x) ? (Fmt::has_inf ? (std::signbit(x) ? 0xFCu : 0x7Cu) : Fmt::nan_code)
                                                 : reference_encode<Fmt>(x);
      ASSERT_EQ(got.codes[i], want) << "element " << i << " v " << v[i] << " x " << x;
    }
  }
  for (std::size_t i = v.size(); i < got.codes.size(); ++i) ASSERT_EQ(got.codes[i], 0u) << "padding";
}

class Fp8Spec : public ::testing::TestWithParam<std::tuple<std::string, std::uint32_t>> {};

// The payload is the spec written out, for blocks that do and do not fill the
// 32-element lanes, with special values sprinkled in; decode and residual
// follow from the codes.
TEST_P(Fp8Spec, PayloadIsTheSpecWrittenOut) {
  const auto [format, block] = GetParam();
  const std::string spec = "fp8:format=" + format + ",block=" + std::to_string(block);
  const auto edges = test::edge_values();
  for (std::size_t n : {1u, 7u, 32u, 33u, 100u, 1000u, 4099u}) {
    SCOPED_TRACE(spec + " n=" + std::to_string(n));
    std::vector<float> g = test::normal(n, n), r0 = test::normal(n, n + 1, 0.1f);
    for (std::size_t i = 0; i < n; i += 7) g[i] = edges[(i / 7) % edges.size()];  // zeros, denormals, huge
    if (n > 50) g[50] = L::quiet_NaN(), g[n - 1] = -L::infinity();
    std::vector<float> r = r0, v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = g[i] + r0[i];
    const test::Encoded e = encode(spec, g, &r);
    const Parsed p = parse(e);
    if (format == "e4m3")
      expect_spec<Fp8E4M3>(v, block, p);
    else
      expect_spec<Fp8E5M2>(v, block, p);
    const auto d = test::decode(*make_codec(spec), e, n);
    for (std::size_t i = 0; i < n; ++i) {
      const float value = format == "e4m3" ? Fp8E4M3::decode(p.codes[i]) : Fp8E5M2::decode(p.codes[i]);
      // value * scale is rounded once; the kernels must not fuse it into out += ...
      const float want = static_cast<float>(static_cast<double>(value) * p.scales[i / block]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(d[i])) << i;
        ASSERT_EQ(r[i], 0.0f) << i;
        continue;
      }
      ASSERT_EQ(bits_of(d[i]), bits_of(0.0f + want)) << i;
      const float res = v[i] - want;
      ASSERT_EQ(bits_of(r[i]), bits_of(std::isfinite(res) ? res : 0.0f)) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsBlocks, Fp8Spec,
                         ::testing::Combine(::testing::Values("e4m3", "e5m2"),
                                            ::testing::Values(1u, 7u, 32u, 100u, 512u, 5000u)));

// A block whose largest |v| is the format's largest value has scale 1: the
// codec then converts every code, every midpoint (ties to even) and the
// floats next to them as the element function does, through the lanes.
template <class Fmt>
void check_lanes_on_boundaries(const char* spec) {
  std::vector<float> v = {Fmt::max_finite};
  for (std::uint32_t c = 0; c < Fmt::max_code; ++c) {
    const float lo = Fmt::decode(c), mid = static_cast<float>((static_cast<double>(lo) + Fmt::decode(c + 1)) / 2);
    for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) v.push_back(x), v.push_back(-x);
  }
  for (float x : {L::denorm_min(), L::min(), 1e-30f}) v.push_back(x), v.push_back(-x);
  const std::string full = std::string(spec) + ",block=" + std::to_string(v.size()) + ",ef=off";
  const Parsed p = parse(encode(full, v, nullptr));
  ASSERT_EQ(p.scales[0], 1.0f);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(p.codes[i], Fmt::encode(v[i])) << full << " v=" << v[i];
}

TEST(Fp8, LanesConvertCodesAndTiesLikeTheElementFunction) {
  check_lanes_on_boundaries<Fp8E4M3>("fp8:format=e4m3");
  check_lanes_on_boundaries<Fp8E5M2>("fp8:format=e5m2");
}

TEST(Fp8, EveryValueIsWithinHalfAnUlp) {
  for (const char* spec : {"fp8:format=e4m3,ef=off", "fp8:format=e5m2,ef=off"}) {
    const auto g = test::normal(4096, 9);
    const auto d = test::decode(*make_codec(spec), encode(spec, g, nullptr), g.size());
    const double ulp = std::string(spec).find("e4m3") != std::string::npos ? 0x1p-3 : 0x1p-2;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double amax = 4.5;  // above every |g| of this seed's block: the bound only needs a ceiling
      const double tol = std::max(ulp / 2 * std::fabs(g[i]) * 1.0001, amax * 0x1p-14);
      ASSERT_LE(std::fabs(d[i] - g[i]), tol) << spec << " i=" << i;
    }
  }
}

TEST(Fp8, ZeroAndTinyBlocksSendZerosAndKeepTheRest) {
  std::vector<float> g(1024, 0.0f);
  for (std::size_t i = 512; i < 1024; ++i) g[i] = (i % 2 ? 1.0f : -3.0f) * std::ldexp(1.0f, -110);
  std::vector<float> r(g.size(), 0.0f);
  const test::Encoded e = encode("fp8", g, &r);
  const Parsed p = parse(e);
  EXPECT_EQ(p.scales[0], 0.0f);
  EXPECT_EQ(p.scales[1], 0.0f);  // amax 3 * 2^-110 < 2^-100
  const auto d = test::decode(*make_codec("fp8"), e, g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(d[i], 0.0f) << i;
    ASSERT_EQ(r[i], g[i]) << i;
  }
}

// inf and NaN reach the output in their element only; the block's scale comes
// from its finite values; the residual drops them.
TEST(Fp8, NonFiniteValuesStayInTheirElement) {
  for (const char* fmt : {"e4m3", "e5m2"}) {
    const std::string spec = std::string("fp8:format=") + fmt + ",block=64";
    std::vector<float> g = test::normal(128, 4);
    g[3] = L::infinity(), g[70] = -L::infinity(), g[100] = L::quiet_NaN();
    std::vector<float> r(g.size(), 0.0f);
    const test::Encoded e = encode(spec, g, &r);
    const auto d = test::decode(*make_codec(spec), e, g.size());
    const bool has_inf = std::string(fmt) == "e5m2";
    EXPECT_TRUE(has_inf ? d[3] == L::infinity() : std::isnan(d[3])) << spec;
    EXPECT_TRUE(has_inf ? d[70] == -L::infinity() : std::isnan(d[70])) << spec;
    EXPECT_TRUE(std::isnan(d[100])) << spec;
    for (std::size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(std::isfinite(r[i])) << i;
      if (i != 3 && i != 70 && i != 100) {
        ASSERT_TRUE(std::isfinite(d[i])) << i;
        ASSERT_LE(std::fabs(d[i] - g[i]), (has_inf ? 0.13 : 0.07) * std::fabs(g[i]) + 1e-3) << i;  // half an ulp
      }
    }
  }
}

TEST(Fp8, HugeValuesUseTheFullRangeWithoutOverflow) {
  std::vector<float> g = {L::max(), -L::max(), 1.0f, 3e38f, -1e-30f, 0.5f * L::max(), L::denorm_min(), 7.0f};
  std::vector<float> r(g.size(), 0.0f);
  const test::Encoded e = encode("fp8:format=e4m3,block=8", g, &r);
  const auto d = test::decode(*make_codec("fp8:format=e4m3,block=8"), e, g.size());
  EXPECT_EQ(parse(e).codes[0], 0x7Eu);  // L::max() maps to 448
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(d[i])) << i;
    ASSERT_TRUE(std::isfinite(r[i])) << i;
  }
  EXPECT_NEAR(d[0], L::max(), 1e-6 * L::max());
}

// 32 + 4 ceil(n/S) + n rounded up to 4 bytes.
TEST(Fp8, PayloadSizeFormula) {
  for (const char* fmt : {"e4m3", "e5m2"})
    for (std::uint32_t block : {1u, 33u, 512u})
      for (std::size_t n : {0u, 1u, 2u, 3u, 4u, 31u, 513u, 100001u}) {
        auto codec = make_codec(std::string("fp8:format=") + fmt + ",block=" + std::to_string(block));
        const std::size_t want = 32 + 4 * ((n + block - 1) / block) + (n + 3) / 4 * 4;
        EXPECT_EQ(test::payload_bytes(*codec, n), want) << fmt << " " << block << " " << n;
        EXPECT_EQ(codec->max_payload_bytes(n), want);
      }
}

TEST(Fp8, SpecKeysAndMessages) {
  EXPECT_EQ(parse_spec("fp8").canonical(), "fp8:format=e4m3,block=512");
  EXPECT_EQ(parse_spec("fp8:block=64,format=e5m2,ef=off").canonical(), "fp8:format=e5m2,block=64,ef=off");
  const auto error_of = test::spec_error;
  EXPECT_NE(error_of("fp8:format=e3m4").find("format must be e4m3 or e5m2"), std::string::npos);
  EXPECT_NE(error_of("fp8:block=0").find("block must be in [1, 2^24 - 1]"), std::string::npos);
  EXPECT_NE(error_of("fp8:bits=8").find("valid keys: format, block, ef"), std::string::npos);
}

TEST(Fp8, RejectsBadHeaderParams) {
  const auto g = test::normal(100, 2);
  auto codec = make_codec("fp8");
  const test::Encoded e = encode("fp8:ef=off", g, nullptr);
  auto expect_error = [&](std::uint32_t param, const std::string& what) {
    test::expect_rejected(*codec, test::with_param(e, param), e.bytes, 100, what);
  };
  expect_error(kernels::fp8_param(3, 512), "fp8 payload with 3 exponent bits (valid: 4 for e4m3, 5 for e5m2)");
  expect_error(kernels::fp8_param(4, 0), "fp8 payload with block size 0");
  expect_error(kernels::fp8_param(5, 512), "differs from the decoder's");  // an e5m2 payload
}

}  // namespace
}  // namespace gz

// qsgd: the payload against an independent write-out of kernels/qsgd.h (scale
// per bucket, level per element, the bit stream), the lane-wide loops against
// the element functions bit for bit, the edge values (zero, constant,
// denormal, huge, inf/NaN buckets), stochastic rounding (Philox known answers,
// unbiased, a pure function of seed, step and element), and the size formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "kernels/qsgd.h"
#include "test_util.h"

namespace gz {
namespace {

using kernels::QsgdScale;
using L = std::numeric_limits<float>;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// What a qsgd payload says, read independently of the codec: scales, then the
// level of every element from the little-endian bit stream.
struct Parsed {
  std::uint32_t bits = 0, bucket = 0;
  std::vector<QsgdScale> scales;
  std::vector<std::uint32_t> levels;
  std::vector<std::uint32_t> words;
};

Parsed parse(const test::Encoded& e) {
  const wire::Header h = wire::read_header(e.data(), e.bytes);
  Parsed p;
  p.bits = h.param >> 24;
  p.bucket = h.param & 0xFFFFFF;
  const std::size_t n = h.count, buckets = (n + p.bucket - 1) / p.bucket, words = (n * p.bits + 31) / 32;
  EXPECT_EQ(h.body_bytes, 8 * buckets + 4 * words);
  const std::byte* body = e.data() + wire::kHeaderBytes;
  p.scales.resize(buckets);
  std::memcpy(p.scales.data(), body, 8 * buckets);
  p.words.resize(words);
  std::memcpy(p.words.data(), body + 8 * buckets, 4 * words);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t q = 0;
    for (std::uint32_t b = 0; b < p.bits; ++b) {
      const std::size_t bit = i * p.bits + b;
      q |= ((p.words[bit / 32] >> (bit % 32)) & 1u) << b;
    }
    p.levels.push_back(q);
  }
  return p;
}

test::Encoded encode(const std::string& spec, const std::vector<float>& g, std::vector<float>* r,
                     std::uint64_t step = 0) {
  auto codec = make_codec(spec);
  test::Encoded e;
  e.storage.assign(codec->max_payload_bytes(g.size()) / 8 + 1, 0xA5A5A5A5A5A5A5A5ull);  // garbage: all must be written
  ExecContext ctx;
  ctx.step = step;
  e.bytes = codec->encode(g.data(), r ? r->data() : nullptr, g.size(), e.data(), codec->max_payload_bytes(g.size()),
                          ctx);
  return e;
}

// The spec of kernels/qsgd.h written out with plain loops: per bucket the
// min/max of the clamped values, the scale, each element's level.
Parsed reference(const std::vector<float>& v, std::uint32_t bits, std::uint32_t bucket, bool stochastic,
                 std::uint32_t seed, std::uint64_t step) {
  Parsed p;
  p.bits = bits, p.bucket = bucket;
  const float levels = static_cast<float>((1u << bits) - 1);
  for (std::size_t begin = 0; begin < v.size(); begin += bucket) {
    const std::size_t end = std::min(v.size(), begin + bucket);
    float lo = kernels::kQsgdClamp, hi = -kernels::kQsgdClamp;
    bool bad = false;
    for (std::size_t i = begin; i < end; ++i) {
      bad |= !std::isfinite(v[i]);
      const float c = std::max(-kernels::kQsgdClamp, std::min(kernels::kQsgdClamp, v[i]));
      if (std::isfinite(v[i])) lo = std::min(lo, c), hi = std::max(hi, c);
    }
    QsgdScale s;
    if (bad) {
      s.lo = s.unit = std::numeric_limits<float>::quiet_NaN();
    } else {
      lo = lo == 0.0f ? 0.0f : lo, hi = hi == 0.0f ? 0.0f : hi;  // +0
      s = {lo, hi / levels - lo / levels};
    }
    p.scales.push_back(s);
    const float inv = s.unit >= L::min() ? 1.0f / s.unit : 0.0f;
    for (std::size_t i = begin; i < end; ++i) {
      if (bad) {
        p.levels.push_back(0);
        continue;
      }
      const float c = std::max(-kernels::kQsgdClamp, std::min(kernels::kQsgdClamp, v[i]));
      const float u = stochastic ? kernels::philox_uniform(seed, step, i) : 0.5f;
      const float y = (c - s.lo) * inv + u;
      p.levels.push_back(static_cast<std::uint32_t>(std::min(std::max(y, 0.0f), levels)));
    }
  }
  return p;
}

void expect_same(const Parsed& got, const Parsed& want, const std::string& what) {
  ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
  for (std::size_t b = 0; b < got.scales.size(); ++b) {
    ASSERT_EQ(bits_of(got.scales[b].lo), bits_of(want.scales[b].lo)) << what << " bucket " << b;
    ASSERT_EQ(bits_of(got.scales[b].unit), bits_of(want.scales[b].unit)) << what << " bucket " << b;
  }
  ASSERT_EQ(got.levels, want.levels) << what;
}

std::vector<float> sum(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// ---------------------------------------------------------------------------

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  using kernels::Philox4;
  auto run = [](Philox4 c, std::uint32_t k0, std::uint32_t k1) { return kernels::philox4x32_10(c, k0, k1); };
  const Philox4 a = run({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(a.w[0], 0x6627e8d5u);
  EXPECT_EQ(a.w[1], 0xe169c58du);
  EXPECT_EQ(a.w[2], 0xbc57ac4cu);
  EXPECT_EQ(a.w[3], 0x9b00dbd8u);
  const Philox4 b = run({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b.w[0], 0x408f276du);
  EXPECT_EQ(b.w[1], 0x41c83b0eu);
  EXPECT_EQ(b.w[2], 0xa20bc7c6u);
  EXPECT_EQ(b.w[3], 0x6d5451fdu);
  const Philox4 c = run({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.w[0], 0xd16cfe09u);
  EXPECT_EQ(c.w[1], 0x94fdccebu);
  EXPECT_EQ(c.w[2], 0x5001e420u);
  EXPECT_EQ(c.w[3], 0x24126ea1u);
}

TEST(Philox, UniformsAreInRangeAndEvenlySpread) {
  std::vector<int> hist(16, 0);
  for (std::uint64_t i = 0; i < 160000; ++i) {
    const float u = kernels::philox_uniform(3, 9, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ++hist[static_cast<int>(u * 16)];
  }
  for (int h : hist) EXPECT_NEAR(h, 10000, 500);  // 5 sigma
}

// cpu::philox_uniforms (SIMD lanes, many groups at once) = philox_uniform, bit
// for bit: group counts that do and do not fill the interleaved pairs, groups
// whose blocks cross into the counter's high word (block 2^32 = group 2^29)
// and near its top, steps above 2^32, seeds at both ends.
TEST(Philox, LaneDrawsAreTheScalarDraws) {
  // The last first group reaches element 2^64 - 1.
  const std::uint64_t firsts[] = {0, 1, 6, (1ull << 29) - 3, (1ull << 32) + 5, (1ull << 59) - 17};
  const std::uint64_t steps[] = {0, 5, (1ull << 32) + 3, ~0ull};
  const std::uint32_t seeds[] = {0, 11, 0xFFFFFFFFu};
  std::vector<float> out;
  for (std::uint64_t first : firsts)
    for (std::uint64_t step : steps)
      for (std::uint32_t seed : seeds)
        for (std::size_t groups : {1u, 2u, 3u, 16u, 17u}) {
          out.assign(groups * kernels::kPhiloxGroup + 1, -1.0f);
          kernels::cpu::philox_uniforms(seed, step, first, groups, out.data());
          for (std::size_t j = 0; j < groups * kernels::kPhiloxGroup; ++j)
            ASSERT_EQ(bits_of(out[j]), bits_of(kernels::philox_uniform(seed, step, first * kernels::kPhiloxGroup + j)))
                << "first group " << first << " step " << step << " seed " << seed << " groups " << groups
                << " j " << j;
          ASSERT_EQ(out.back(), -1.0f) << "wrote past the groups";
        }
}

// Stochastic payloads = the spec written out across seeds and steps (above
// 2^32 too), widths with and without lanes, buckets of whole groups whose
// dithers come in one chunk, several, or a chunk and a remainder, and tails.
TEST(Qsgd, StochasticPayloadIsTheSpecForEverySeedAndStep) {
  for (std::uint32_t seed : {0u, 7u, 3000000000u})
    for (std::uint64_t step : {std::uint64_t{0}, std::uint64_t{1}, (std::uint64_t{1} << 32) + 9})
      for (std::uint32_t bits : {2u, 3u, 4u, 8u})
        for (std::uint32_t bucket : {32u, 96u, 512u, 544u, 1100u}) {
          const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket) +
                                   ",stochastic=on,seed=" + std::to_string(seed);
          const std::size_t n = 2 * bucket + 37;
          SCOPED_TRACE(spec + " step " + std::to_string(step));
          const auto g = test::normal(n, seed + bits), r0 = test::normal(n, bucket, 0.1f);
          std::vector<float> r = r0;
          const Parsed got = parse(encode(spec, g, &r, step));
          expect_same(got, reference(sum(g, r0), bits, bucket, true, seed, step), spec);
        }
}

// Payload = the spec written out, for every width, bucket sizes that are and
// are not multiples of 32 (the group and the one-by-one paths), both roundings.
class QsgdSpec : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint32_t, bool>> {};

TEST_P(QsgdSpec, PayloadIsTheSpecWrittenOut) {
  const auto [bits, bucket, stochastic] = GetParam();
  const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket) +
                           (stochastic ? ",stochastic=on,seed=11" : "");
  for (std::size_t n : {1u, 31u, 32u, 33u, 95u, 1000u, 4099u}) {
    SCOPED_TRACE(spec + " n=" + std::to_string(n));
    const auto g = test::normal(n, n + bits), r0 = test::normal(n, n + 7, 0.1f);
    std::vector<float> r = r0;
    const test::Encoded e = encode(spec, g, &r, 5);
    const Parsed got = parse(e);
    expect_same(got, reference(sum(g, r0), bits, bucket, stochastic, 11, 5), spec);
    // Padding bits are zero.
    const std::size_t used = n * bits % 32;
    if (used) {
      EXPECT_EQ(got.words.back() >> used, 0u);
    }
    // Decode and residual follow from the levels; r carries the rest exactly.
    const auto d = test::decode(*make_codec(spec), e, n);
    for (std::size_t i = 0; i < n; ++i) {
      const QsgdScale s = got.scales[i / bucket];
      // q * unit is exact in double: rounding it to float is the float product, so
      // `want` is two roundings whatever the compiler contracts (the kernels must not fuse).
      const float product = static_cast<float>(static_cast<double>(got.levels[i]) * s.unit);
      const float want = s.lo + product;
      ASSERT_EQ(bits_of(d[i]), bits_of(0.0f + want)) << i;
      ASSERT_EQ(bits_of(r[i]), bits_of((g[i] + r0[i]) - want)) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WidthsBuckets, QsgdSpec,
                         ::testing::Combine(::testing::Values(2u, 3u, 4u, 5u, 6u, 7u, 8u),
                                            ::testing::Values(1u, 7u, 32u, 100u, 512u), ::testing::Bool()));

// Round to nearest: each value is within half a step of what it decodes to.
TEST(Qsgd, NearestIsWithinHalfAStep) {
  for (std::uint32_t bits : {2u, 4u, 8u}) {
    const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",bucket=256,ef=off";
    const auto g = test::normal(10000, bits);
    const test::Encoded e = encode(spec, g, nullptr);
    const Parsed p = parse(e);
    const auto d = test::decode(*make_codec(spec), e, g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float unit = p.scales[i / 256].unit;
      ASSERT_LE(std::fabs(d[i] - g[i]), 0.5f * unit * (1 + 1e-5f) + 1e-6f) << spec << " i=" << i;
    }
  }
}

// Stochastic rounding is unbiased: over many steps (each its own Philox
// stream) the decoded values average to the input, where rounding to nearest
// would keep its bias.
TEST(Qsgd, StochasticRoundingIsUnbiased) {
  const std::size_t n = 64;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i) / n;  // levels at 0, 1/3, 2/3, 1 for 2 bits
  g[n - 1] = 1.0f;
  std::vector<double> mean_sr(n, 0.0), mean_rn(n, 0.0);
  const int steps = 4000;
  for (int t = 0; t < steps; ++t) {
    const auto sr = test::decode(*make_codec("qsgd:bits=2,bucket=64,stochastic=on,ef=off"),
                                 encode("qsgd:bits=2,bucket=64,stochastic=on,ef=off", g, nullptr, t), n);
    const auto rn = test::decode(*make_codec("qsgd:bits=2,bucket=64,ef=off"),
                                 encode("qsgd:bits=2,bucket=64,ef=off", g, nullptr, t), n);
    for (std::size_t i = 0; i < n; ++i) mean_sr[i] += sr[i] / steps, mean_rn[i] += rn[i] / steps;
  }
  double worst_sr = 0, worst_rn = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst_sr = std::max(worst_sr, std::fabs(mean_sr[i] - g[i]));
    worst_rn = std::max(worst_rn, std::fabs(mean_rn[i] - g[i]));
  }
  EXPECT_LT(worst_sr, 0.02);  // one step is 1/3; sigma of a mean of 4000 draws <= 0.0027
  EXPECT_GT(worst_rn, 0.1);   // nearest keeps up to half a step of bias
}

// The dither is a pure function of (seed, step, element): the same call gives
// the same bits, another step or seed others.
TEST(Qsgd, StochasticBitsDependOnSeedAndStepOnly) {
  const auto g = test::normal(5000, 1);
  auto bytes = [&](const std::string& spec, std::uint64_t step) {
    const test::Encoded e = encode(spec, g, nullptr, step);
    return std::vector<std::byte>(e.data(), e.data() + e.bytes);
  };
  const std::string a = "qsgd:stochastic=on,ef=off", b = "qsgd:stochastic=on,seed=1,ef=off";
  EXPECT_EQ(bytes(a, 3), bytes(a, 3));
  EXPECT_NE(bytes(a, 3), bytes(a, 4));
  EXPECT_NE(bytes(a, 3), bytes(b, 3));
  EXPECT_EQ(bytes("qsgd:ef=off", 3), bytes("qsgd:ef=off", 4));  // nearest: the step does not matter
  EXPECT_EQ(make_codec("qsgd:stochastic=on,seed=0")->spec(), "qsgd:bits=4,bucket=512,stochastic=on");
}

TEST(Qsgd, ZeroAndConstantBucketsAreExact) {
  std::vector<float> g(1024, -0.0f);  // min and max of a bucket of -0 are -0
  for (std::size_t i = 512; i < 1024; ++i) g[i] = -3.25f;
  g[7] = 0.0f;
  std::vector<float> r(g.size(), -0.0f);  // -0 + -0 = -0
  const test::Encoded e = encode("qsgd", g, &r);
  const Parsed p = parse(e);
  EXPECT_EQ(bits_of(p.scales[0].lo), 0u);  // -0 made +0
  EXPECT_EQ(bits_of(p.scales[0].unit), 0u);
  EXPECT_EQ(p.scales[1].lo, -3.25f);
  EXPECT_EQ(p.scales[1].unit, 0.0f);
  const auto d = test::decode(*make_codec("qsgd"), e, g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(d[i], g[i]) << i;
    ASSERT_EQ(r[i], 0.0f) << i;
  }
}

// A bucket of denormals has a step below FLT_MIN: it sends its minimum, and
// the residual keeps the rest exactly.
TEST(Qsgd, DenormalBucketSendsItsMinimum) {
  std::vector<float> g(64);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = L::denorm_min() * static_cast<float>(i % 9);
  std::vector<float> r(g.size(), 0.0f);
  const auto d = test::decode(*make_codec("qsgd:bucket=64"), encode("qsgd:bucket=64", g, &r), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(d[i], 0.0f);
    ASSERT_EQ(r[i], g[i]);
  }
}

// Values beyond +-2^126 are clamped (max - min cannot overflow); the residual
// carries the excess; nothing decodes to inf or NaN.
TEST(Qsgd, HugeValuesSaturateAndTheResidualKeepsTheRest) {
  std::vector<float> g = {L::max(), -L::max(), 1.0f, -1e38f, 3e38f, 0.0f, 1e30f, -2.0f};
  std::vector<float> r(g.size(), 0.0f);
  const test::Encoded e = encode("qsgd:bits=8,bucket=8", g, &r);
  const auto d = test::decode(*make_codec("qsgd:bits=8,bucket=8"), e, g.size());
  EXPECT_EQ(parse(e).scales[0].lo, -kernels::kQsgdClamp);
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(d[i])) << i;
    ASSERT_TRUE(std::isfinite(r[i])) << i;
    ASSERT_LE(std::fabs(d[i]), kernels::kQsgdClamp * 1.0001f);
    EXPECT_EQ(r[i], g[i] - d[i]) << i;
  }
  EXPECT_NEAR(d[0], kernels::kQsgdClamp, 1e-6 * kernels::kQsgdClamp);
}

// Values beyond the clamp in buckets of whole groups (the lane paths, which
// skip the clamp in buckets that need none): payload and residual as the spec.
TEST(Qsgd, HugeValuesInLaneBucketsAreTheSpec) {
  auto g = test::normal(200, 3);
  g[5] = L::max(), g[40] = -3e38f, g[70] = 1e38f, g[130] = -L::max(), g[131] = L::max(), g[199] = 2e38f;
  const auto r0 = test::normal(g.size(), 4, 0.1f);
  for (std::uint32_t bits : {2u, 3u, 4u, 8u})
    for (std::uint32_t bucket : {32u, 64u})
      for (bool stochastic : {false, true}) {
        const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket) +
                                 (stochastic ? ",stochastic=on" : "");
        SCOPED_TRACE(spec);
        std::vector<float> r = r0;
        const Parsed got = parse(encode(spec, g, &r, 2));
        expect_same(got, reference(sum(g, r0), bits, bucket, stochastic, 0, 2), spec);
        for (std::size_t i = 0; i < g.size(); ++i) {
          const QsgdScale s = got.scales[i / bucket];
          const float want = s.lo + static_cast<float>(static_cast<double>(got.levels[i]) * s.unit);
          const float res = (g[i] + r0[i]) - want;
          ASSERT_EQ(bits_of(r[i]), bits_of(std::isfinite(res) ? res : 0.0f)) << i;
        }
      }
}

// inf or NaN makes its own bucket decode to NaN (loss scalers see it); the
// residual drops it; the neighbouring buckets are untouched.
TEST(Qsgd, NonFiniteValuesPoisonOnlyTheirBucket) {
  for (float bad : {L::infinity(), -L::infinity(), L::quiet_NaN()}) {
    std::vector<float> g = test::normal(96, 3);
    g[40] = bad;
    std::vector<float> r(g.size(), 0.25f);
    const test::Encoded e = encode("qsgd:bucket=32", g, &r);
    const Parsed p = parse(e);
    EXPECT_EQ(bits_of(p.scales[1].lo), kernels::kQsgdNaNBits);
    EXPECT_EQ(bits_of(p.scales[1].unit), kernels::kQsgdNaNBits);
    for (std::size_t i = 32; i < 64; ++i) EXPECT_EQ(p.levels[i], 0u);
    const auto d = test::decode(*make_codec("qsgd:bucket=32"), e, g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const bool in_bad = i >= 32 && i < 64;
      ASSERT_EQ(std::isnan(d[i]), in_bad) << i;
      ASSERT_TRUE(std::isfinite(r[i])) << i;
      if (in_bad) {
        ASSERT_EQ(r[i], 0.0f) << i;
      }
    }
  }
}

// 32 + 8 ceil(n/S) + 4 ceil(n B / 32) bytes.
TEST(Qsgd, PayloadSizeFormula) {
  for (std::uint32_t bits : {2u, 3u, 4u, 8u})
    for (std::uint32_t bucket : {1u, 33u, 512u})
      for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 511u, 513u, 100000u}) {
        auto codec = make_codec("qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket));
        const std::size_t want = 32 + 8 * ((n + bucket - 1) / bucket) + 4 * ((n * bits + 31) / 32);
        EXPECT_EQ(test::payload_bytes(*codec, n), want) << bits << " " << bucket << " " << n;
        EXPECT_EQ(codec->max_payload_bytes(n), want);
      }
  EXPECT_EQ(test::payload_bytes(*make_codec("qsgd"), 16u << 20), 32u + 8u * 32768u + (16u << 20) / 2);
}

TEST(Qsgd, SpecKeysAndMessages) {
  EXPECT_EQ(parse_spec("qsgd").canonical(), "qsgd:bits=4,bucket=512");
  EXPECT_EQ(parse_spec("qsgd:bucket=1024,bits=8,stochastic=off").canonical(), "qsgd:bits=8,bucket=1024");
  EXPECT_EQ(parse_spec("qsgd:stochastic=on,seed=9,ef=off").canonical(), "qsgd:bits=4,bucket=512,stochastic=on,seed=9,ef=off");
  const auto error_of = test::spec_error;
  EXPECT_NE(error_of("qsgd:bits=1").find("bits must be in [2, 8]"), std::string::npos);
  EXPECT_NE(error_of("qsgd:bits=9").find("bits must be in [2, 8]"), std::string::npos);
  EXPECT_NE(error_of("qsgd:bucket=0").find("bucket must be in [1, 2^24 - 1]"), std::string::npos);
  EXPECT_NE(error_of("qsgd:bucket=16777216").find("bucket must be"), std::string::npos);
  EXPECT_NE(error_of("qsgd:stochastic=maybe").find("stochastic must be off or on"), std::string::npos);
  EXPECT_NE(error_of("qsgd:block=4").find("valid keys: bits, bucket, stochastic, seed, ef"), std::string::npos);
}

// Header params no qsgd encoder writes are rejected before the body is read;
// a payload of other bits or another bucket size is not this decoder's.
TEST(Qsgd, RejectsBadHeaderParams) {
  const auto g = test::normal(100, 2);
  auto codec = make_codec("qsgd");
  const test::Encoded e = encode("qsgd:ef=off", g, nullptr);
  auto expect_error = [&](std::uint32_t param, const std::string& what) {
    test::expect_rejected(*codec, test::with_param(e, param), e.bytes, 100, what);
  };
  expect_error(kernels::qsgd_param(9, 512), "qsgd payload with 9 bits per element (valid: 2..8)");
  expect_error(kernels::qsgd_param(1, 512), "1 bits per element");
  expect_error(kernels::qsgd_param(4, 0), "qsgd payload with bucket size 0");
  expect_error(kernels::qsgd_param(4, 100), "differs from the decoder's");  // another bucket size
  const test::Encoded other = encode("qsgd:bits=8,ef=off", g, nullptr);
  std::vector<float> out(100, 0.0f);
  EXPECT_THROW(test::decode_into(*codec, other.data(), other.bytes, out.data(), 100), PayloadError);
}

// With error feedback the running sum of decoded values stays within about a
// step of the running sum of gradients; without it, the rounding errors of
// every step add up (a random walk, ~sqrt(steps) steps away).
TEST(Qsgd, ErrorFeedbackKeepsTheSumThatDriftsWithout) {
  auto with = make_codec("qsgd:bits=2"), without = make_codec("qsgd:bits=2,ef=off");
  EXPECT_LT(test::drift_over_steps(*with).worst, 6.0);
  const test::Drift d = test::drift_over_steps(*without);
  EXPECT_GT(d.worst, 1.2 * d.at_half);
  EXPECT_GT(d.worst, 6.0);
}

}  // namespace
}  // namespace gz

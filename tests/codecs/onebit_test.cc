// onebit: scales are the block means (in the documented summation order),
// bits are the signs, decode gives each element its block's matching mean.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu.h"
#include "test_util.h"

namespace gz {
namespace {

using kernels::OnebitScales;

// The order kernels/onebit.h specifies, written out independently: 32 lanes
// striped over the block in double, then the halving tree.
OnebitScales spec_scales(const float* v, std::size_t len) {
  double pos[32] = {}, neg[32] = {};
  std::uint32_t ncnt = 0;
  for (std::size_t j = 0; j < len; ++j) {
    if (v[j] < 0.0f) {
      neg[j % 32] += v[j];
      ++ncnt;
    } else {
      pos[j % 32] += v[j];
    }
  }
  for (int off = 16; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) pos[l] += pos[l + off], neg[l] += neg[l + off];
  const std::uint32_t pcnt = static_cast<std::uint32_t>(len) - ncnt;
  return {pcnt ? static_cast<float>(pos[0] / pcnt) : 0.0f, ncnt ? static_cast<float>(neg[0] / ncnt) : 0.0f};
}

struct Decoded {
  std::vector<OnebitScales> scales;
  std::vector<std::uint32_t> bits;
};

Decoded encode_raw(const std::vector<float>& g, std::vector<float>* r, std::uint32_t block) {
  const std::size_t n = g.size();
  Decoded d{std::vector<OnebitScales>(kernels::onebit_blocks(n, block)),
            std::vector<std::uint32_t>(kernels::onebit_words(n), 0xDEADBEEF)};
  kernels::cpu::onebit_encode(g.data(), r ? r->data() : nullptr, n, block, d.scales.data(), d.bits.data());
  return d;
}

class OnebitBlocks : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(OnebitBlocks, ScalesAreBlockMeansInSpecOrder) {
  const std::uint32_t block = GetParam();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{33}, std::size_t{block - 1},
                        std::size_t{block + 1}, std::size_t{5 * block + 7}, std::size_t{4099}}) {
    const auto g = test::normal(n, 100 + n);
    const Decoded d = encode_raw(g, nullptr, block);
    for (std::size_t b = 0; b < d.scales.size(); ++b) {
      const std::size_t begin = b * block, len = std::min<std::size_t>(block, n - begin);
      const OnebitScales want = spec_scales(g.data() + begin, len);
      ASSERT_EQ(d.scales[b].pos, want.pos) << "n=" << n << " block " << b;
      ASSERT_EQ(d.scales[b].neg, want.neg) << "n=" << n << " block " << b;
      // and those are the means, to float rounding
      long double ps = 0, ns = 0;
      std::size_t pc = 0, nc = 0;
      for (std::size_t j = begin; j < begin + len; ++j) (g[j] < 0 ? (ns += g[j], ++nc) : (ps += g[j], ++pc));
      if (pc) {
        ASSERT_FLOAT_EQ(d.scales[b].pos, static_cast<float>(ps / pc));
      }
      if (nc) {
        ASSERT_FLOAT_EQ(d.scales[b].neg, static_cast<float>(ns / nc));
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ((d.bits[i / 32] >> (i % 32)) & 1u, g[i] < 0.0f ? 1u : 0u) << i;
    if (n % 32) {
      ASSERT_EQ(d.bits.back() >> (n % 32), 0u) << "padding bits must be zero";
    }
  }
}

TEST_P(OnebitBlocks, DecodeGivesBlockMeansAndResidualIsTheRest) {
  const std::uint32_t block = GetParam();
  auto codec = make_codec("onebit:block=" + std::to_string(block));
  const std::size_t n = 3 * block + 17;
  const auto g = test::normal(n, 9);
  std::vector<float> r(n, 0.0f);
  const auto e = test::encode(*codec, g, &r);
  const auto d = test::decode(*codec, e, n);
  const Decoded raw = encode_raw(g, nullptr, block);
  for (std::size_t i = 0; i < n; ++i) {
    const OnebitScales s = raw.scales[i / block];
    ASSERT_EQ(d[i], g[i] < 0 ? s.neg : s.pos) << i;
    ASSERT_EQ(r[i], g[i] - d[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, OnebitBlocks, ::testing::Values(1u, 7u, 31u, 32u, 33u, 100u, 512u, 4096u));

TEST(Onebit, ConstantSignBlocksAndZeros) {
  auto codec = make_codec("onebit:block=4,ef=off");
  std::vector<float> g = {1, 2, 3, 6, -1, -2, -3, -6, 0.0f, -0.0f, 0.0f, 0.0f};
  const auto d = test::decode(*codec, test::encode(*codec, g, nullptr), g.size());
  const std::vector<float> want = {3, 3, 3, 3, -3, -3, -3, -3, 0, 0, 0, 0};
  EXPECT_EQ(d, want);
  const Decoded raw = encode_raw(g, nullptr, 4);
  EXPECT_EQ(raw.scales[0].neg, 0.0f);  // no negatives: neg mean is 0
  EXPECT_EQ(raw.scales[1].pos, 0.0f);
  EXPECT_EQ(raw.bits[0], 0x0F0u);  // -0 is non-negative
}

TEST(Onebit, NonFiniteInputsPropagateButAreNotCarried) {
  auto codec = make_codec("onebit:block=4");
  std::vector<float> g = {1, NAN, -1, 2, 1, INFINITY, -1, -3, 1, 2, 3, 4};
  std::vector<float> r(g.size(), 0.0f);
  const auto d = test::decode(*codec, test::encode(*codec, g, &r), g.size());
  EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]) && std::isnan(d[3]));
  EXPECT_EQ(d[2], -1.0f);
  EXPECT_EQ(d[4], INFINITY);
  EXPECT_EQ(d[6], -2.0f);
  for (int i = 0; i < 8; ++i)
    if (g[i] >= 0 || std::isnan(g[i])) {
      EXPECT_EQ(r[i], 0.0f) << i;  // non-finite differences dropped
    }
  EXPECT_EQ(r[6], 1.0f);
  EXPECT_EQ(d[8], 2.5f);
}

TEST(Onebit, MaxFloatDoesNotOverflowTheMean) {
  using L = std::numeric_limits<float>;
  auto codec = make_codec("onebit:block=4,ef=off");
  std::vector<float> g = {L::max(), L::max(), -L::max(), -L::max()};
  const auto d = test::decode(*codec, test::encode(*codec, g, nullptr), 4);
  EXPECT_EQ(d[0], L::max());  // summed in double
  EXPECT_EQ(d[2], -L::max());
}

TEST(Onebit, DenormalsAreAveragedExactly) {
  using L = std::numeric_limits<float>;
  auto codec = make_codec("onebit:block=2,ef=off");
  std::vector<float> g = {L::denorm_min(), 3 * L::denorm_min()};
  const auto d = test::decode(*codec, test::encode(*codec, g, nullptr), 2);
  EXPECT_EQ(d[0], 2 * L::denorm_min());
}

// ceil(n/B) scale pairs and ceil(n/32) sign words after the 32-byte header.
TEST(Onebit, PayloadSizeFormula) {
  for (std::size_t block : {1u, 100u, 512u})
    for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 511u, 513u, 100000u}) {
      auto codec = make_codec("onebit:block=" + std::to_string(block));
      const std::size_t want = 32 + 8 * ((n + block - 1) / block) + 4 * ((n + 31) / 32);
      EXPECT_EQ(test::payload_bytes(*codec, n), want) << "block " << block << " n " << n;
      EXPECT_EQ(codec->max_payload_bytes(n), want);
    }
}

// With error feedback the drift stays small (the residual); without it the
// bias that the block means round away keeps adding up.
TEST(Onebit, ErrorFeedbackKeepsTheBiasThatItLosesWithout) {
  auto with = make_codec("onebit:block=512"), without = make_codec("onebit:block=512,ef=off");
  EXPECT_LT(test::drift_over_steps(*with).worst, 12.0);
  const test::Drift d = test::drift_over_steps(*without);
  EXPECT_GT(d.worst, 1.5 * d.at_half);
  EXPECT_GT(d.worst, 6.0);
}

}  // namespace
}  // namespace gz

// Properties every codec must have, run over every spec in test::all_specs():
// the error-feedback invariant, bounded drift over many steps, determinism,
// payload size, edge values, and argument checks.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "kernels/combine.h"
#include "kernels/onebit.h"
#include "test_util.h"

namespace gz {
namespace {

class CodecProperty : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<Codec> codec = make_codec(GetParam());
};

class ErrorFeedbackProperty : public CodecProperty {};

// decode(payload) + r_new == g + r_old, to the rounding of one add and one subtract.
TEST_P(ErrorFeedbackProperty, Invariant) {
  ASSERT_TRUE(codec->error_feedback());
  for (std::size_t n : {1u, 1000u, 100003u}) {
    const auto g = test::normal(n, n);
    std::vector<float> r = test::normal(n, n + 1, 0.1f);
    const std::vector<float> r_old = r;
    const auto d = test::decode(*codec, test::encode(*codec, g, &r), n);
    for (std::size_t i = 0; i < n; ++i) {
      const float v = g[i] + r_old[i];
      const float tol = 4 * std::numeric_limits<float>::epsilon() * (std::fabs(v) + std::fabs(d[i]));
      ASSERT_NEAR(d[i] + r[i], v, tol) << GetParam() << " n=" << n << " i=" << i;
    }
  }
}

// Sum over steps of decoded payloads minus sum of gradients equals -r_T: it
// stays bounded with error feedback, and grows without it.
TEST_P(CodecProperty, ManyStepsStayCloseToTheRunningSum) {
  const std::size_t n = 4096, steps = 300;
  std::vector<float> r(n, 0.0f);
  std::vector<double> sum_g(n, 0.0), sum_d(n, 0.0);
  double worst = 0.0, at_half = 0.0;
  for (std::size_t t = 1; t <= steps; ++t) {
    auto g = test::normal(n, 1000 + t);
    for (auto& x : g) x += 0.05f;  // a bias that compression without EF loses
    const auto d = test::decode(*codec, test::encode(*codec, g, codec->error_feedback() ? &r : nullptr), n);
    double drift = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i], sum_d[i] += d[i];
      drift = std::max(drift, std::fabs(sum_d[i] - sum_g[i]));
    }
    worst = std::max(worst, drift);
    if (t == steps / 2) at_half = worst;
  }
  const CodecId id = codec->id();
  if (codec->error_feedback() || id == CodecId::None || id == CodecId::Fp16 || id == CodecId::Bf16) {
    // Bounded: the drift is the residual, which does not keep growing.
    const double bound = id == CodecId::TopK ? 40.0 : id == CodecId::OneBit ? 12.0 : 6.0;
    EXPECT_LT(worst, bound) << GetParam();
    EXPECT_LT(worst, 1.5 * at_half + 1e-3) << GetParam() << ": drift still growing";
  } else {
    // Without EF, onebit and topk lose the bias: the drift grows with steps.
    EXPECT_GT(worst, 1.5 * at_half) << GetParam();
    EXPECT_GT(worst, 6.0) << GetParam();
  }
}

TEST_P(CodecProperty, Deterministic) {
  const auto g = test::normal(70001, 3);
  std::vector<float> r1 = test::normal(g.size(), 4, 0.2f), r2 = r1;
  const auto a = test::encode(*codec, g, &r1), b = test::encode(*codec, g, &r2);
  ASSERT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes), 0);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0);
}

TEST_P(CodecProperty, PayloadSizeMatchesTheFormula) {
  const CodecConfig& c = codec->config();
  for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 511u, 513u, 100000u}) {
    const auto g = test::normal(n, 5);
    std::vector<float> r(n, 0.0f);
    const auto e = test::encode(*codec, g, &r);
    std::size_t want = 0;
    switch (c.id) {
      case CodecId::None: want = 32 + 4 * n; break;
      case CodecId::Fp16:
      case CodecId::Bf16: want = 32 + 2 * n; break;
      case CodecId::OneBit: want = 32 + 8 * ((n + c.block - 1) / c.block) + 4 * ((n + 31) / 32); break;
      case CodecId::TopK: want = 32 + 8 * c.topk_k(n); break;
    }
    if (c.id == CodecId::TopK && c.select == TopkSelect::Sample) {
      EXPECT_LE(e.bytes, codec->max_payload_bytes(n));
      EXPECT_EQ((e.bytes - 32) % 8, 0u);
    } else {
      EXPECT_EQ(e.bytes, want) << GetParam() << " n=" << n;
      EXPECT_EQ(codec->max_payload_bytes(n), want);
    }
    const wire::Header h = wire::read_header(e.data(), e.bytes);
    EXPECT_EQ(h.count, n);
  }
}

TEST_P(CodecProperty, EdgeValuesRoundTrip) {
  const auto edges = test::edge_values();
  std::vector<float> g;
  for (int rep = 0; rep < 40; ++rep) g.insert(g.end(), edges.begin(), edges.end());
  std::vector<float> r(g.size(), 0.0f);
  const auto d = test::decode(*codec, test::encode(*codec, g, &r), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_FALSE(std::isnan(d[i])) << GetParam() << ": finite input decoded to NaN at " << i;
    if (codec->error_feedback()) {
      ASSERT_TRUE(std::isfinite(r[i])) << i;
    }
  }
  if (codec->id() == CodecId::None) {
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(test::same_float(d[i], 0.0f + g[i]));
  }
}

TEST_P(CodecProperty, NonFiniteGradientsReachTheOutput) {
  std::vector<float> g = test::normal(5000, 8);
  g[1234] = NAN;
  g[4321] = INFINITY;
  std::vector<float> r(g.size(), 0.0f);
  const auto d = test::decode(*codec, test::encode(*codec, g, &r), g.size());
  EXPECT_TRUE(std::isnan(d[1234])) << GetParam();
  EXPECT_TRUE(std::isinf(d[4321]) || std::isnan(d[4321])) << GetParam();
  for (float x : r) ASSERT_TRUE(std::isfinite(x)) << "residual poisoned by a non-finite gradient";
}

TEST_P(CodecProperty, DecodeAccumulatesIntoTheOutput) {
  const auto g = test::normal(999, 6);
  std::vector<float> r(g.size(), 0.0f);
  const auto e = test::encode(*codec, g, &r);
  const auto once = test::decode(*codec, e, g.size());
  std::vector<float> out(g.size(), 1.5f);
  codec->decode_accumulate(e.data(), e.bytes, out.data(), out.size());
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 1.5f + once[i]);
}

// Every combine mode (kernels/combine.h): out = (old + d or d) * scale, with d
// what an overwrite decodes (top-k: +0 where the payload names nothing; the
// old values here are never -0, so adding that +0 changes nothing).
TEST_P(CodecProperty, DecodeModesFollowCombine) {
  const std::size_t n = 40003;
  const auto g = test::normal(n, 21);
  std::vector<float> r(n, 0.0f);
  const auto e = test::encode(*codec, g, &r);
  std::vector<float> d(n, NAN);
  codec->decode(e.data(), e.bytes, d.data(), n, Combine{false, 1.0f});
  for (std::size_t i = 0; i < n; ++i) ASSERT_FALSE(std::isnan(d[i])) << "overwrite left element " << i;
  const auto old = test::normal(n, 22);
  for (const Combine c : {Combine{true, 1.0f}, Combine{false, 1.0f}, Combine{true, 0.125f}, Combine{false, 0.3f}}) {
    std::vector<float> out = old;
    codec->decode(e.data(), e.bytes, out.data(), n, c);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_TRUE(test::same_float(out[i], kernels::combine(old[i], d[i], c)))
          << GetParam() << " i " << i << " accumulate " << c.accumulate << " scale " << c.scale;
  }
}

// decode_sum is the ordered decodes (first overwrites, last scales), bit for
// bit, whatever the tiling; it never reads out (NaN there changes nothing).
TEST_P(CodecProperty, DecodeSumEqualsOrderedDecodes) {
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{70001}})
    for (std::size_t m : {1u, 2u, 3u})
      for (float scale : {1.0f, 1.0f / 3}) {
        std::vector<test::Encoded> es;
        std::vector<PayloadRef> refs;
        for (std::size_t j = 0; j < m; ++j) {
          std::vector<float> r(n, 0.0f);
          es.push_back(test::encode(*codec, test::normal(n, 30 + j), &r));
        }
        for (const auto& e : es) refs.push_back(PayloadRef{e.data(), e.bytes});
        std::vector<float> want(n, 7.0f), got(n, NAN);
        for (std::size_t j = 0; j < m; ++j)
          codec->decode(es[j].data(), es[j].bytes, want.data(), n, Combine{j > 0, j + 1 == m ? scale : 1.0f});
        codec->decode_sum(refs, got.data(), n, scale);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_TRUE(test::same_float(got[i], want[i])) << GetParam() << " n " << n << " m " << m << " i " << i;
      }
}

// A malformed payload anywhere in a sum is rejected before out is touched.
TEST_P(CodecProperty, DecodeSumValidatesEveryPayloadFirst) {
  const std::size_t n = 20000;
  std::vector<float> r(n, 0.0f);
  auto a = test::encode(*codec, test::normal(n, 40), &r), b = test::encode(*codec, test::normal(n, 41), &r);
  b.data()[0] ^= std::byte{0xFF};  // the magic
  const std::vector<PayloadRef> refs = {{a.data(), a.bytes}, {b.data(), b.bytes}};
  std::vector<float> out(n, 2.5f);
  EXPECT_THROW(codec->decode_sum(refs, out.data(), n, 0.5f), PayloadError);
  for (float x : out) ASSERT_EQ(x, 2.5f);
}

TEST_P(CodecProperty, RejectsBadArguments) {
  std::vector<float> g(100, 1.0f), r(100, 0.0f);
  std::vector<std::uint64_t> buf(codec->max_payload_bytes(100) / 8 + 1);
  auto* p = reinterpret_cast<std::byte*>(buf.data());
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, p, codec->max_payload_bytes(100) - 1), InvalidArgument);
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, nullptr, 1 << 20), InvalidArgument);
  EXPECT_THROW(codec->encode(nullptr, r.data(), 100, p, buf.size() * 8), InvalidArgument);
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, p + 2, buf.size() * 8 - 8), InvalidArgument);
  if (codec->error_feedback()) {
    EXPECT_THROW(codec->encode(g.data(), nullptr, 100, p, buf.size() * 8), InvalidArgument);
  } else {
    EXPECT_NO_THROW(codec->encode(g.data(), nullptr, 100, p, buf.size() * 8));
  }
}

std::string spec_test_name(const ::testing::TestParamInfo<const char*>& param_info) {
  std::string s = param_info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<const char*> specs_with_feedback() {
  std::vector<const char*> out;
  for (const char* s : test::all_specs())
    if (parse_spec(s).ef) out.push_back(s);
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecProperty, ::testing::ValuesIn(test::all_specs()), spec_test_name);
INSTANTIATE_TEST_SUITE_P(WithFeedback, ErrorFeedbackProperty, ::testing::ValuesIn(specs_with_feedback()),
                         spec_test_name);

}  // namespace
}  // namespace gz

// Properties every codec must have, run over every registered codec's test
// specs (test::all_specs()): the error-feedback invariant, bounded drift over
// many steps, determinism, payload size, edge values, and argument checks.
// What only one codec promises (its payload formula, what it loses without
// error feedback) lives in that codec's own test file.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "kernels/combine.h"
#include "test_util.h"

namespace gz {
namespace {

class CodecProperty : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Codec> codec = make_codec(GetParam());
};

class ErrorFeedbackProperty : public CodecProperty {};
class BoundedDriftProperty : public CodecProperty {};

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

// Sum over steps of decoded payloads minus sum of gradients equals -r_T: with
// error feedback (or a lossless codec) it stays bounded, so a bias in the
// gradients comes through in full.
TEST_P(BoundedDriftProperty, ManyStepsStayCloseToTheRunningSum) {
  const test::Drift d = test::drift_over_steps(*codec);
  // Bounded: the drift is the residual, which does not keep growing, and it
  // stays far below the 15 per element that the bias adds up to.
  EXPECT_LT(d.worst, 1.5 * d.at_half + 1e-3) << GetParam() << ": drift still growing";
  EXPECT_LT(d.worst, 50.0) << GetParam();
}

TEST_P(CodecProperty, Deterministic) {
  const auto g = test::normal(70001, 3);
  std::vector<float> r1 = test::normal(g.size(), 4, 0.2f), r2 = r1;
  const auto a = test::encode(*codec, g, &r1), b = test::encode(*codec, g, &r2);
  ASSERT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes), 0);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0);
}

// The size rule, as the descriptor and the layout state it (each codec's own
// test writes its formula out independently).
TEST_P(CodecProperty, PayloadSizeFollowsTheLayout) {
  for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 511u, 513u, 100000u}) {
    const auto g = test::normal(n, 5);
    std::vector<float> r(n, 0.0f);
    const auto e = test::encode(*codec, g, &r);
    const wire::Header h = wire::read_header(e.data(), e.bytes);
    EXPECT_EQ(h.count, n);
    EXPECT_EQ(h.codec, codec->id());
    EXPECT_EQ(e.bytes, wire::kHeaderBytes + wire::body_bytes(h.codec, h.param, n));
    if (codec->fixed_size()) {
      EXPECT_EQ(e.bytes, codec->max_payload_bytes(n)) << GetParam() << " n=" << n;
      EXPECT_EQ(h.param, codec->header_param(n)) << GetParam() << " n=" << n;
    } else {
      EXPECT_LE(e.bytes, codec->max_payload_bytes(n)) << GetParam() << " n=" << n;
    }
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
  if (codec->descriptor().lossless) {
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
  test::decode_into(*codec, e.data(), e.bytes, out.data(), out.size());
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
  test::HostWorkspace ws(*codec, 100);
  const ExecContext ctx = ws.ctx();
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, p, codec->max_payload_bytes(100) - 1, ctx), InvalidArgument);
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, nullptr, 1 << 20, ctx), InvalidArgument);
  EXPECT_THROW(codec->encode(nullptr, r.data(), 100, p, buf.size() * 8, ctx), InvalidArgument);
  EXPECT_THROW(codec->encode(g.data(), r.data(), 100, p + 2, buf.size() * 8 - 8, ctx), InvalidArgument);
  if (codec->error_feedback()) {
    EXPECT_THROW(codec->encode(g.data(), nullptr, 100, p, buf.size() * 8, ctx), InvalidArgument);
  } else {
    EXPECT_NO_THROW(codec->encode(g.data(), nullptr, 100, p, buf.size() * 8, ctx));
  }
}

// Two phases, strictly: a call that needs scratch and is given none, or too
// little, throws before touching anything; the Codec never allocates.
TEST_P(CodecProperty, NeedsTheWorkspaceItAskedFor) {
  const std::size_t n = 100000;
  const std::size_t need = codec->workspace_bytes(n, Device::Cpu);
  const auto g = test::normal(n, 9);
  std::vector<float> r(n, 0.0f);
  std::vector<std::uint64_t> buf(codec->max_payload_bytes(n) / 8 + 1);
  auto* p = reinterpret_cast<std::byte*>(buf.data());
  if (need == 0) {
    EXPECT_NO_THROW(codec->encode(g.data(), r.data(), n, p, buf.size() * 8));
    return;
  }
  const std::vector<float> r0 = r;
  EXPECT_THROW(codec->encode(g.data(), r.data(), n, p, buf.size() * 8), InvalidArgument);
  std::vector<std::byte> small(need - 1);
  EXPECT_THROW(codec->encode(g.data(), r.data(), n, p, buf.size() * 8, {Device::Cpu, nullptr, small.data(), need - 1}),
               InvalidArgument);
  EXPECT_EQ(r, r0) << "a refused call changed the residual";
  test::HostWorkspace ws(*codec, n);
  EXPECT_NO_THROW(codec->encode(g.data(), r.data(), n, p, buf.size() * 8, ws.ctx()));
}

std::string spec_test_name(const ::testing::TestParamInfo<std::string>& param_info) {
  std::string s = param_info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<std::string> specs_where(bool (*keep)(const CodecConfig&)) {
  std::vector<std::string> out;
  for (const std::string& s : test::all_specs())
    if (keep(parse_spec(s))) out.push_back(s);
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecProperty, ::testing::ValuesIn(test::all_specs()), spec_test_name);
INSTANTIATE_TEST_SUITE_P(WithFeedback, ErrorFeedbackProperty,
                         ::testing::ValuesIn(specs_where([](const CodecConfig& c) { return c.ef; })), spec_test_name);
// With error feedback on, or lossless (which needs none).
INSTANTIATE_TEST_SUITE_P(
    FeedbackOrLossless, BoundedDriftProperty,
    ::testing::ValuesIn(specs_where([](const CodecConfig& c) { return c.ef || c.descriptor().lossless; })),
    spec_test_name);

}  // namespace
}  // namespace gz

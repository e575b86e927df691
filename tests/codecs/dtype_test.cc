// 16-bit gradients (float16, bfloat16) through every codec's test specs:
//   - encode reads the exact widening: the payload and the float residual of a
//     16-bit gradient are the bits the float path gives for float(g);
//   - a decode into a 16-bit output is the float path's result rounded once
//     (round to nearest even), for overwrite, accumulate, scale and sums;
//   - the error-feedback invariant holds with the float residual;
//   - edge values (inf, NaN, subnormals, the largest finite values, -0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/error.h"
#include "kernels/cpu.h"
#include "kernels/element.h"
#include "test_util.h"

namespace gz {
namespace {

struct DtypeCase {
  std::string spec;
  Dtype dtype;
};

std::string case_name(const ::testing::TestParamInfo<DtypeCase>& info) {
  std::string s = info.param.spec + "_" + to_string(info.param.dtype);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s + "_" + std::to_string(info.index);
}

std::vector<DtypeCase> all_cases() {
  std::vector<DtypeCase> out;
  for (const std::string& s : test::all_specs())
    for (Dtype d : {Dtype::Float16, Dtype::BFloat16}) out.push_back({s, d});
  return out;
}

// A 16-bit buffer (raw bits) and its exact float widening. The reference
// conversions are the scalar element functions of kernels/cast.h (tested
// bit by bit in cast_test.cc), not the loops under test.
struct Buffer16 {
  Dtype dtype;
  std::vector<std::uint16_t> bits;

  std::vector<float> widened() const {
    std::vector<float> f(bits.size());
    for (std::size_t i = 0; i < f.size(); ++i)
      f[i] = dtype == Dtype::Float16 ? kernels::half_to_float(bits[i]) : kernels::bf16_to_float(bits[i]);
    return f;
  }
  static Buffer16 rounded(Dtype dtype, const std::vector<float>& f) {
    Buffer16 b{dtype, std::vector<std::uint16_t>(f.size())};
    for (std::size_t i = 0; i < f.size(); ++i)
      b.bits[i] = dtype == Dtype::Float16 ? kernels::half_from_float_rne(f[i]) : kernels::bf16_from_float_rne(f[i]);
    return b;
  }
};

class DtypeProperty : public ::testing::TestWithParam<DtypeCase> {
 protected:
  std::unique_ptr<Codec> codec = make_codec(GetParam().spec);
  Dtype dtype = GetParam().dtype;

  // Gaussian values with the edge values mixed in, rounded to the dtype.
  Buffer16 gradient(std::size_t n, std::uint64_t seed, bool edges) const {
    std::vector<float> f = test::normal(n, seed);
    if (edges) {
      const auto e = test::edge_values();
      for (std::size_t i = 0; i < n; i += 7) f[i] = e[(i / 7) % e.size()];
    }
    return Buffer16::rounded(dtype, f);
  }

  test::Encoded encode16(const Buffer16& g, std::vector<float>* r) {
    test::Encoded e;
    const std::size_t n = g.bits.size(), cap = codec->max_payload_bytes(n);
    e.storage.assign(cap / 8 + 1, 0);
    std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu, dtype));
    e.bytes = codec->encode(g.bits.data(), dtype, r ? r->data() : nullptr, n, e.data(), cap,
                            ExecContext{Device::Cpu, nullptr, ws.data(), ws.size()});
    return e;
  }
  std::vector<float> residual(std::size_t n, std::uint64_t seed) const {
    return codec->error_feedback() ? test::normal(n, seed, 0.1f) : std::vector<float>{};
  }
};

void expect_same_bits(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << " i=" << i;
}

TEST_P(DtypeProperty, EncodeIsTheEncodeOfTheWidening) {
  for (std::size_t n : {0u, 1u, 33u, 1000u, 70001u}) {
    for (bool edges : {false, true}) {
      const Buffer16 g = gradient(n, n + 11, edges);
      std::vector<float> r16 = residual(n, n + 12), r32 = r16;
      const auto a = encode16(g, codec->error_feedback() ? &r16 : nullptr);
      const auto b = test::encode(*codec, g.widened(), codec->error_feedback() ? &r32 : nullptr);
      ASSERT_EQ(a.bytes, b.bytes) << GetParam().spec << " n=" << n;
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.bytes), 0) << GetParam().spec << " n=" << n << " edges=" << edges;
      ASSERT_EQ(std::memcmp(r16.data(), r32.data(), r16.size() * sizeof(float)), 0) << GetParam().spec << " n=" << n;
    }
  }
}

// d + r_new == float(g) + r_old with the residual kept in float.
TEST_P(DtypeProperty, ErrorFeedbackInvariantWithFloatResidual) {
  if (!codec->error_feedback()) GTEST_SKIP() << "ef=off";
  const std::size_t n = 10007;
  const Buffer16 g = gradient(n, 21, false);
  const std::vector<float> gf = g.widened();
  std::vector<float> r = residual(n, 22);
  const std::vector<float> r_old = r;
  const auto d = test::decode(*codec, encode16(g, &r), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = gf[i] + r_old[i];
    const float tol = 4 * std::numeric_limits<float>::epsilon() * (std::fabs(v) + std::fabs(d[i]));
    ASSERT_NEAR(d[i] + r[i], v, tol) << GetParam().spec << " i=" << i;
  }
}

// Every decode mode into a 16-bit output is the float path rounded once.
TEST_P(DtypeProperty, DecodeRoundsTheFloatResultOnce) {
  const std::size_t n = 9001;  // several CPU tiles and a tail
  std::vector<float> r = residual(n, 31);
  const auto p = test::encode(*codec, test::normal(n, 30), codec->error_feedback() ? &r : nullptr);
  std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu, dtype));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  const Buffer16 start = gradient(n, 32, true);
  for (Combine c : {Combine{true, 1.0f}, Combine{false, 1.0f}, Combine{true, 0.25f}, Combine{false, 0.5f}}) {
    Buffer16 out = start;
    codec->decode(p.data(), p.bytes, out.bits.data(), dtype, n, c, ctx);
    std::vector<float> ref = start.widened();
    codec->decode(p.data(), p.bytes, ref.data(), n, c, ctx);
    expect_same_bits(out.bits, Buffer16::rounded(dtype, ref).bits,
                     GetParam().spec + (c.accumulate ? " accumulate" : " overwrite") + " scale=" + std::to_string(c.scale));
  }
}

TEST_P(DtypeProperty, SumAccumulatesInFloatAndRoundsOnce) {
  const std::size_t n = 9001;
  std::vector<test::Encoded> ps;
  std::vector<PayloadRef> refs;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> r = residual(n, 40 + j);
    ps.push_back(test::encode(*codec, test::normal(n, 50 + j), codec->error_feedback() ? &r : nullptr));
  }
  for (const auto& p : ps) refs.push_back({p.data(), p.bytes});
  std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu, dtype));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  Buffer16 out = gradient(n, 60, false);
  codec->decode_sum(refs, out.bits.data(), dtype, n, 1.0f / 3, ctx);
  std::vector<float> ref(n);
  codec->decode_sum(refs, ref.data(), n, 1.0f / 3, ctx);
  expect_same_bits(out.bits, Buffer16::rounded(dtype, ref).bits, GetParam().spec);
}

// A malformed payload leaves a 16-bit output as it was.
TEST_P(DtypeProperty, MalformedPayloadLeavesTheOutputUnchanged) {
  const std::size_t n = 100;
  std::vector<float> r = residual(n, 70);
  auto p = test::encode(*codec, test::normal(n, 71), codec->error_feedback() ? &r : nullptr);
  const Buffer16 start = gradient(n, 72, false);
  Buffer16 out = start;
  EXPECT_THROW(codec->decode_accumulate(p.data(), p.bytes, out.bits.data(), dtype, n + 1), PayloadError);
  expect_same_bits(out.bits, start.bits, GetParam().spec);
}

INSTANTIATE_TEST_SUITE_P(Codecs, DtypeProperty, ::testing::ValuesIn(all_cases()), case_name);

// The element conversions themselves: the stores round to nearest even and
// overflow to inf (IEEE, as torch's .to()), NaN stays NaN; loads are exact.
TEST(ElementTypes, RoundingAtTheEdges) {
  using kernels::BFloat16;
  using kernels::Half;
  using kernels::from_float;
  using kernels::to_float;
  EXPECT_EQ(from_float<Half>(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(from_float<Half>(65519.0f).bits, 0x7BFF);   // below the midpoint to 65536
  EXPECT_EQ(from_float<Half>(65520.0f).bits, 0x7C00);   // ties to even: inf
  EXPECT_EQ(from_float<Half>(-1e30f).bits, 0xFC00);
  EXPECT_EQ(from_float<Half>(5.9604645e-8f).bits, 0x0001);  // the smallest subnormal
  EXPECT_EQ(from_float<Half>(2.9802322e-8f).bits, 0x0000);  // half of it: ties to even (0)
  EXPECT_EQ(from_float<Half>(-0.0f).bits, 0x8000);
  EXPECT_EQ(from_float<BFloat16>(std::numeric_limits<float>::max()).bits, 0x7F80);  // rounds up to inf
  EXPECT_EQ(from_float<BFloat16>(1.00390625f).bits, 0x3F80);  // 1 + 2^-8: tie, to even
  EXPECT_EQ(from_float<BFloat16>(1.01171875f).bits, 0x3F82);  // 1 + 3 * 2^-8: tie, to even (up)
  EXPECT_TRUE(std::isnan(to_float(from_float<BFloat16>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(to_float(from_float<Half>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(to_float(Half{0x0001}), 5.9604645e-8f);
  EXPECT_EQ(to_float(BFloat16{0x0001}), std::numeric_limits<float>::denorm_min() * 65536);
  // The 8-lane widening (AVX2/F16C where built) agrees with the element function on every bit pattern.
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> h(all.size()), b(all.size());
  kernels::cpu::widen(reinterpret_cast<const Half*>(all.data()), all.size(), h.data());
  kernels::cpu::widen(reinterpret_cast<const BFloat16*>(all.data()), all.size(), b.data());
  for (std::size_t i = 0; i < all.size(); ++i) {
    ASSERT_TRUE(test::same_float(h[i], kernels::half_to_float(all[i]))) << i;
    ASSERT_TRUE(test::same_float(b[i], kernels::bf16_to_float(all[i]))) << i;
  }
}

// The narrowing loop (8 lanes where built) rounds like the element functions
// on every class of float: random bit patterns, and around every rounding
// boundary, overflow threshold, subnormal range and NaN payload.
TEST(ElementTypes, NarrowingLoopMatchesTheElementFunctions) {
  std::vector<std::uint32_t> bits;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t m : {0u, 1u, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u, 0x18000u,
                            0x400000u, 0x7FFFFFu})
      for (std::uint32_t sign : {0u, 0x80000000u}) bits.push_back(sign | (e << 23) | m);
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  std::vector<kernels::Half> h(f.size());
  std::vector<kernels::BFloat16> b(f.size());
  kernels::cpu::narrow(f.data(), f.size(), h.data());
  kernels::cpu::narrow(f.data(), f.size(), b.data());
  for (std::size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(h[i].bits, kernels::half_from_float_rne(f[i])) << std::hex << bits[i];
    ASSERT_EQ(b[i].bits, kernels::bf16_from_float_rne(f[i])) << std::hex << bits[i];
  }
}

TEST(ElementTypes, WorkspaceCoversTheWidening) {
  const auto onebit = make_codec("onebit:block=64,ef=off");
  EXPECT_EQ(onebit->workspace_bytes(100, Device::Cpu), 0u);
  EXPECT_GE(onebit->workspace_bytes(100, Device::Cpu, Dtype::BFloat16), 400u);
  const auto ef = make_codec("onebit");
  EXPECT_EQ(ef->workspace_bytes(100, Device::Cpu, Dtype::Float16), 0u);  // widened at the EF input
  EXPECT_GE(ef->workspace_bytes(100, Device::Cuda, Dtype::Float16), Codec::kCudaStatusBytes + 400u);
  // A 16-bit encode without EF and without the workspace is a clear error.
  std::vector<std::uint16_t> g(100, 0x3F80);
  std::vector<std::byte> payload(onebit->max_payload_bytes(100) + 8);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(payload.data()) + 7) & ~std::uintptr_t{7});
  EXPECT_THROW(onebit->encode(g.data(), Dtype::BFloat16, nullptr, 100, aligned, onebit->max_payload_bytes(100)),
               InvalidArgument);
}

}  // namespace
}  // namespace gz

// topk: the exact selection against a sort-based reference, over
// distributions chosen to drive every path of the radix select (sampled
// candidates, too few candidates, too many, small inputs), with ties, K = 0
// and K = n; the sampled (DGC) mode against its documented bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>

#include "kernels/cpu.h"
#include "test_util.h"

namespace gz {
namespace {

// Indices of the k largest |v| (ties: lower index first), increasing.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& v, std::size_t k) {
  std::vector<std::uint32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0u);
  auto key = [&](std::uint32_t i) { return kernels::topk_key(v[i]); };
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return key(a) > key(b); });
  order.resize(std::min(k, v.size()));
  std::sort(order.begin(), order.end());
  return order;
}

struct Result {
  std::vector<std::uint32_t> idx;
  std::vector<float> val;
};

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Runs the CPU encoder into outputs of exactly the documented size (k, or
// topk_sampled_max(k), at most n), followed by guard entries that must stay
// untouched: the vector emits store whole lines and must stop short of the end.
Result run_topk(const std::vector<float>& g, std::vector<float>* r, std::size_t k, bool sampled = false) {
  constexpr std::size_t kGuard = 64;
  constexpr std::uint32_t kGuardIdx = 0xDEADBEEFu;
  const float guard_val = std::bit_cast<float>(0x7FBADBADu);
  const std::size_t n = g.size();
  std::size_t ws_bytes = 0;
  kernels::cpu::topk_encode<float>(nullptr, ws_bytes, nullptr, nullptr, n, k, nullptr, nullptr);
  std::vector<std::byte> ws(ws_bytes);
  const std::size_t cap = std::min(sampled ? kernels::cpu::topk_sampled_max(k) : k, n);
  Result res{std::vector<std::uint32_t>(cap + kGuard, kGuardIdx), std::vector<float>(cap + kGuard, guard_val)};
  float* rp = r ? r->data() : nullptr;
  const std::size_t c = sampled ? kernels::cpu::topk_encode_sampled(ws.data(), ws_bytes, g.data(), rp, n, k,
                                                                     res.idx.data(), res.val.data())
                                : kernels::cpu::topk_encode(ws.data(), ws_bytes, g.data(), rp, n, k, res.idx.data(),
                                                            res.val.data());
  EXPECT_LE(c, cap);
  for (std::size_t j = cap; j < cap + kGuard; ++j) {
    EXPECT_EQ(res.idx[j], kGuardIdx) << "index written past the end, at " << j - cap;
    EXPECT_EQ(bits(res.val[j]), bits(guard_val)) << "value written past the end, at " << j - cap;
  }
  res.idx.resize(c);
  res.val.resize(c);
  return res;
}

enum class Dist { Normal, Cauchy, FewLevels, AllZero, AllEqual, SpikesOnSample, SpikesOffSample, Exponents, Clustered, NaNs };

std::vector<float> make(Dist d, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  switch (d) {
    case Dist::Normal:
      return test::normal(n, seed);
    case Dist::Cauchy: {
      std::cauchy_distribution<float> c;
      for (auto& x : v) x = c(rng);
      return v;
    }
    case Dist::FewLevels: {  // massive ties
      std::uniform_int_distribution<int> u(-2, 2);
      for (auto& x : v) x = static_cast<float>(u(rng));
      return v;
    }
    case Dist::AllZero:
      return v;
    case Dist::AllEqual:  // one magnitude, both signs: every line holds a tie
      for (auto& x : v) x = rng() % 2 ? 0.75f : -0.75f;
      return v;
    case Dist::NaNs: {  // 3% NaNs of assorted payloads (all rank alike) and 0.5% infinities
      const std::uint32_t payloads[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u};
      v = test::normal(n, seed);
      for (auto& x : v) {
        const std::uint64_t u = rng() % 1000;
        if (u < 30) x = std::bit_cast<float>(payloads[u % 6]);
        else if (u < 35) x = u % 2 ? INFINITY : -INFINITY;
      }
      return v;
    }
    case Dist::SpikesOnSample:  // the sample sees spikes the rest of the data lacks
      v = test::normal(n, seed);
      for (std::size_t j = 0; j < 16384 && n >= 65536; ++j) v[j * n / 16384] = 100.0f + static_cast<float>(j);
      return v;
    case Dist::SpikesOffSample:  // the largest values hide between sampled positions
      v = test::normal(n, seed, 1e-3f);
      for (std::size_t j = 0; j + 1 < n; j += 97) v[j + 1] = (j % 2 ? 1.0f : -1.0f) * static_cast<float>(j + 1);
      return v;
    case Dist::Clustered:  // every large value in one eighth: more candidates than a per-stream slice holds
      v = test::normal(n, seed, 1e-3f);
      for (std::size_t i = n / 8; i < n / 4; ++i) v[i] *= 1000.0f;
      return v;
    case Dist::Exponents: {
      std::uniform_int_distribution<int> e(-140, 120);
      for (auto& x : v) x = std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8.0f, e(rng)) * (rng() % 2 ? 1 : -1);
      return v;
    }
  }
  return v;
}

struct Case {
  Dist dist;
  std::size_t n;
  std::size_t k;
};

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::Normal: return "Normal";
    case Dist::Cauchy: return "Cauchy";
    case Dist::FewLevels: return "FewLevels";
    case Dist::AllZero: return "AllZero";
    case Dist::AllEqual: return "AllEqual";
    case Dist::SpikesOnSample: return "SpikesOnSample";
    case Dist::SpikesOffSample: return "SpikesOffSample";
    case Dist::Exponents: return "Exponents";
    case Dist::Clustered: return "Clustered";
    case Dist::NaNs: return "NaNs";
  }
  return "?";
}

void PrintTo(const Case& c, std::ostream* os) { *os << dist_name(c.dist) << " n=" << c.n << " k=" << c.k; }

class TopkExact : public ::testing::TestWithParam<Case> {};

TEST_P(TopkExact, MatchesSortReferenceWithAndWithoutFeedback) {
  const Case c = GetParam();
  const std::vector<float> g = make(c.dist, c.n, c.n * 31 + c.k);
  const auto want = reference_topk(g, c.k);

  const Result plain = run_topk(g, nullptr, c.k);
  ASSERT_EQ(plain.idx, want);
  for (std::size_t j = 0; j < plain.idx.size(); ++j) ASSERT_EQ(bits(plain.val[j]), bits(g[plain.idx[j]])) << j;

  std::vector<float> r0 = test::normal(c.n, 77, 0.5f);
  std::vector<float> r = r0;
  const Result fed = run_topk(g, &r, c.k);
  std::vector<float> v(c.n);
  for (std::size_t i = 0; i < c.n; ++i) v[i] = g[i] + r0[i];
  ASSERT_EQ(fed.idx, reference_topk(v, c.k));
  std::vector<bool> sent(c.n, false);
  for (std::size_t j = 0; j < fed.idx.size(); ++j) {
    sent[fed.idx[j]] = true;
    ASSERT_TRUE(test::same_float(fed.val[j], v[fed.idx[j]]));
  }
  for (std::size_t i = 0; i < c.n; ++i) ASSERT_TRUE(test::same_float(r[i], sent[i] ? 0.0f : v[i])) << i;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Dist d : {Dist::Normal, Dist::Cauchy, Dist::FewLevels, Dist::AllZero, Dist::AllEqual, Dist::Exponents,
                 Dist::NaNs}) {
    for (std::size_t n : {0u, 1u, 2u, 31u, 1000u}) {
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, n / 2, n - (n > 0), n, n + 3}) out.push_back({d, n, k});
    }
    for (std::size_t k : {1u, 10u, 2621u, 40000u, 262143u}) out.push_back({d, 262144, k});
  }
  for (std::size_t k : {100u, 2000u, 20000u}) {
    out.push_back({Dist::SpikesOnSample, 262144, k});
    out.push_back({Dist::SpikesOffSample, 262144, k});
  }
  for (std::size_t k : {2621u, 20000u}) out.push_back({Dist::Clustered, 262144, k});
  out.push_back({Dist::Clustered, (1u << 20) + 3, 10486});
  out.push_back({Dist::Normal, (1u << 20) + 3, 10486});
  // Lengths that end inside a line and inside the last stream's chunk (4 x 16 elements).
  for (std::size_t n : {65536u + 15u, 65536u + 63u, 262144u + 49u}) {
    for (std::size_t k : {std::size_t{7}, n / 100, n / 10}) {
      out.push_back({Dist::Normal, n, k});
      out.push_back({Dist::NaNs, n, k});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, TopkExact, ::testing::ValuesIn(cases()));

TEST(Topk, TiesGoToTheLowerIndex) {
  std::vector<float> g = {1, -3, 3, 2, -3, 3, 0};
  EXPECT_EQ(run_topk(g, nullptr, 2).idx, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(run_topk(g, nullptr, 4).idx, (std::vector<std::uint32_t>{1, 2, 4, 5}));
  EXPECT_EQ(run_topk(g, nullptr, 5).idx, (std::vector<std::uint32_t>{1, 2, 3, 4, 5}));
  std::vector<float> zeros(100000, 0.0f);  // every element ties
  const Result r = run_topk(zeros, nullptr, 1000);
  ASSERT_EQ(r.idx.size(), 1000u);
  for (std::uint32_t j = 0; j < 1000; ++j) ASSERT_EQ(r.idx[j], j);
}

TEST(Topk, NaNAndInfAreAlwaysSent) {
  std::vector<float> g = test::normal(100000, 4);
  g[500] = NAN;
  g[70000] = -INFINITY;
  g[99999] = std::numeric_limits<float>::max();
  EXPECT_EQ(run_topk(g, nullptr, 3).idx, (std::vector<std::uint32_t>{500, 70000, 99999}));
}

// The candidate pass walks 4 chunks in lockstep, 16-element lines, each
// chunk listing into its own quarter ("slice") of the candidate arrays, and
// stores whole compressed lines while a line fits. Here chunk 0 fills its
// slice to within one line of the end, and chunk 1's entries start right
// after it: a line stored past the end of slice 0 would overwrite them.
TEST(Topk, CandidateSliceFilledToWithinOneLine) {
  constexpr std::size_t n = 262144, kStreams = 4, kLine = 16, chunk = n / kStreams;
  // The sample's bound (kernels/topk.h policy) and the candidates per chunk.
  auto candidates = [&](const std::vector<float>& v, std::size_t k) {
    std::vector<std::uint32_t> sample(kernels::kTopkSample);
    for (std::size_t j = 0; j < sample.size(); ++j) sample[j] = kernels::topk_key(v[kernels::topk_sample_position(j, n)]);
    const std::size_t rank = kernels::topk_sample_rank(n, k, false);
    std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank - 1), sample.end(),
                     std::greater<>());
    std::vector<std::size_t> per_chunk(kStreams, 0);
    for (std::size_t i = 0; i < n; ++i) per_chunk[i / chunk] += kernels::topk_key(v[i]) >= sample[rank - 1];
    return per_chunk;
  };
  // Chunk 0 opens with m decreasing large values, chunk 1 with three larger ones; the rest is small.
  const std::vector<float> small = test::normal(n, 9, 1e-3f);
  auto data = [&](std::size_t m) {
    std::vector<float> v = small;
    for (std::size_t i = 0; i < m; ++i) v[i] = 1000.0f - 0.01f * static_cast<float>(i);
    for (std::size_t i = 0; i < 3; ++i) v[chunk + i] = -2000.0f;
    return v;
  };
  bool found = false;
  for (std::size_t k = 1000; k < 6000 && !found; k += 7) {
    const std::size_t slice = kernels::topk_candidate_capacity(n, k) / kStreams;
    const std::size_t m = slice - 2;  // whole lines up to slice - 16 + 14, then a partial one
    const std::vector<float> g = data(m);
    const auto per_chunk = candidates(g, k);
    const std::size_t last_line_start = per_chunk[0] / kLine * kLine;
    if (per_chunk[0] > slice || last_line_start + kLine <= slice || per_chunk[1] != 3 ||
        per_chunk[0] + per_chunk[1] < k)
      continue;
    found = true;
    EXPECT_EQ(run_topk(g, nullptr, k).idx, reference_topk(g, k)) << "k=" << k;
  }
  ASSERT_TRUE(found) << "no k puts chunk 0's last line across its slice end: the layout changed";
}

TEST(Topk, DeterministicAcrossCalls) {
  const auto g = make(Dist::FewLevels, 300000, 5);
  const Result a = run_topk(g, nullptr, 3000), b = run_topk(g, nullptr, 3000);
  EXPECT_EQ(a.idx, b.idx);
}

TEST(TopkSampled, CountWithinBoundAndSendsTheLargest) {
  for (Dist d : {Dist::Normal, Dist::Cauchy, Dist::FewLevels, Dist::SpikesOffSample, Dist::Exponents, Dist::NaNs}) {
    for (std::size_t k : {30u, 3000u, 30000u}) {
      const std::size_t n = 300000;
      const auto g = make(d, n, k);
      std::vector<float> r(n, 0.0f);
      const Result res = run_topk(g, &r, k, true);
      ASSERT_GE(res.idx.size(), kernels::cpu::topk_sampled_min(k));
      ASSERT_LE(res.idx.size(), kernels::cpu::topk_sampled_max(k));
      ASSERT_TRUE(std::is_sorted(res.idx.begin(), res.idx.end()));
      ASSERT_EQ(std::adjacent_find(res.idx.begin(), res.idx.end()), res.idx.end());
      // Every element sent is at least as large as every element kept back.
      std::vector<bool> sent(n, false);
      std::uint32_t min_sent = ~0u, max_kept = 0;
      for (auto i : res.idx) sent[i] = true, min_sent = std::min(min_sent, kernels::topk_key(g[i]));
      for (std::size_t i = 0; i < n; ++i)
        if (!sent[i]) max_kept = std::max(max_kept, kernels::topk_key(g[i]));
      ASSERT_GE(min_sent, max_kept);
      // More precisely, the set is a top set by (key, lower index first): all
      // keys >= the sample's bound, or (fallback) the exact top k.
      ASSERT_EQ(res.idx, reference_topk(g, res.idx.size()));
    }
  }
}

TEST(TopkCodec, PayloadCarriesKEntries) {
  auto codec = make_codec("topk:density=0.01");
  const auto g = test::normal(12345, 2);
  std::vector<float> r(g.size(), 0.0f);
  const auto e = test::encode(*codec, g, &r);
  EXPECT_EQ(e.bytes, 32u + 8u * 124u);
  const auto d = test::decode(*codec, e, g.size());
  const auto want = reference_topk(g, 124);
  std::size_t nz = 0;
  for (std::size_t i = 0; i < g.size(); ++i) nz += d[i] != 0.0f;
  EXPECT_EQ(nz, 124u);
  for (auto i : want) EXPECT_EQ(d[i], g[i]);
}

// K (u32 index, f32 value) pairs after the 32-byte header; sampled: at most
// topk_sampled_max(K) of them, a multiple of 8 bytes.
TEST(TopkCodec, PayloadSizeFormula) {
  for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 511u, 513u, 100000u}) {
    auto exact = make_codec("topk:density=0.01"), fixed = make_codec("topk:k=7");
    const std::size_t k = kernels::topk_k_for_density(n, 0.01);
    EXPECT_EQ(test::payload_bytes(*exact, n), 32 + 8 * k) << n;
    EXPECT_EQ(test::payload_bytes(*fixed, n), 32 + 8 * std::min<std::size_t>(7, n)) << n;
    auto sampled = make_codec("topk:density=0.3,select=sample");
    const std::size_t bytes = test::payload_bytes(*sampled, n);
    EXPECT_EQ((bytes - 32) % 8, 0u);
    EXPECT_LE(bytes, 32 + 8 * std::min(n, kernels::cpu::topk_sampled_max(kernels::topk_k_for_density(n, 0.3))));
    EXPECT_FALSE(sampled->fixed_size());
    EXPECT_TRUE(exact->fixed_size());
  }
}

TEST(TopkCodec, ErrorFeedbackKeepsTheBiasThatItLosesWithout) {
  auto with = make_codec("topk:density=0.01"), without = make_codec("topk:density=0.05,ef=off");
  EXPECT_LT(test::drift_over_steps(*with).worst, 40.0);
  const test::Drift d = test::drift_over_steps(*without);
  EXPECT_GT(d.worst, 1.5 * d.at_half);
  EXPECT_GT(d.worst, 6.0);
}

}  // namespace
}  // namespace gz

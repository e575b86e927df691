// The allreduce algorithms with every rank a thread (ThreadTransport +
// HashStore): fast, many rank counts and sizes. The real multi-process runs
// over UCX are in mp_test.cc.
#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <mutex>

#include "comm/agreement.h"
#include "comm/allreduce.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "tests/comm/reference.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {
namespace {

struct RankResult {
  std::vector<float> out;
  AllreduceStats stats;
  std::size_t comm_bytes = 0;
};

// One allreduce on `P` threads; returns each rank's output.
std::vector<RankResult> run_once(int P, std::size_t n, const std::string& spec, Algorithm algo,
                                 ReduceOp op = ReduceOp::Sum, bool integer = false) {
  std::vector<RankResult> res(static_cast<std::size_t>(P));
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    AllreduceState state;
    auto& mine = res[static_cast<std::size_t>(r)];
    mine.out = make_input(r, n, 0, integer);
    AllreduceOptions o;
    o.transport = &t;
    o.store = &store;
    o.workspace = &ws;
    o.codec = codec.get();
    o.state = &state;
    o.buffer = mine.out.data();
    o.n = n;
    o.op = op;
    o.algorithm = algo;
    o.timeout = Timeout(20000);
    o.stats = &mine.stats;
    allreduce(o);
    mine.comm_bytes = ws.comm_bytes();
  });
  for (int r = 0; r < P; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], nullptr) << "rank " << r << ": " << what(errors[static_cast<std::size_t>(r)]);
  return res;
}

TEST(ChunkRange, CoversBufferWithSizesDifferingByAtMostOne) {
  for (std::size_t n : {0, 1, 3, 4, 7, 100, 1001})
    for (int P : {1, 2, 3, 4, 7}) {
      std::size_t next = 0;
      for (int j = 0; j < P; ++j) {
        const ChunkRange c = chunk_range(n, P, j);
        EXPECT_EQ(c.offset, next);
        EXPECT_TRUE(c.count == n / P || c.count == n / P + 1);
        next += c.count;
      }
      EXPECT_EQ(next, n) << "n=" << n << " P=" << P;
    }
}

TEST(ResolveAlgorithm, FollowsTheDocumentedRule) {
  const auto topk = parse_spec("topk"), onebit = parse_spec("onebit"), none = parse_spec("none");
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, 2), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, 4), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, none, 3), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, topk, 8), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, topk, 32), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Allgather, none, 8), Algorithm::Allgather);
  EXPECT_EQ(parse_algorithm("scatter_reduce"), Algorithm::ScatterReduce);
  EXPECT_THROW(parse_algorithm("ring"), InvalidArgument);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::Average);
  EXPECT_THROW(parse_reduce_op("max"), InvalidArgument);
}

class ExactNone : public ::testing::TestWithParam<std::tuple<int, std::size_t, Algorithm>> {};

// none with integer-valued inputs: every rank gets exactly the sum.
TEST_P(ExactNone, EqualsTheExactSumBitForBit) {
  const auto [P, n, algo] = GetParam();
  const auto res = run_once(P, n, "none", algo, ReduceOp::Sum, true);
  const auto exact = exact_sum(P, n, 0, true);
  for (int r = 0; r < P; ++r) {
    const auto& out = res[static_cast<std::size_t>(r)].out;
    ASSERT_EQ(out.size(), n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(exact[i])) << "rank " << r << " i " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksSizes, ExactNone,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values(0, 1, 3, 4, 1001),
                                            ::testing::Values(Algorithm::Allgather, Algorithm::ScatterReduce)));

class Lossy : public ::testing::TestWithParam<std::tuple<std::string, int, Algorithm>> {};

// Lossy codecs: within the documented bound, identical on every rank.
TEST_P(Lossy, WithinBoundAndIdenticalOnAllRanks) {
  const auto [spec, P, algo] = GetParam();
  const std::size_t n = 4099;
  const auto res = run_once(P, n, spec, algo);
  const double err = rel_error(res[0].out, exact_sum(P, n));
  EXPECT_LE(err, allreduce_error_bound(parse_spec(spec))) << spec;
  RecordProperty("rel_error", std::to_string(err));
  for (int r = 1; r < P; ++r)
    EXPECT_EQ(fingerprint(res[static_cast<std::size_t>(r)].out.data(), n), fingerprint(res[0].out.data(), n))
        << "rank " << r << " differs from rank 0";
}

// Every registered lossy codec's benchmark specs (descriptor.h).
std::vector<std::string> lossy_specs() {
  std::vector<std::string> out;
  for (const CodecDescriptor* d : all_codecs())
    if (!d->lossless)
      for (const BenchSpec& b : d->bench_specs) out.emplace_back(b.spec);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Codecs, Lossy,
                         ::testing::Combine(::testing::ValuesIn(lossy_specs()),
                                            ::testing::Values(2, 3, 4),
                                            ::testing::Values(Algorithm::Allgather, Algorithm::ScatterReduce)));

TEST(Allreduce, UnevenSizesWorkForEveryCodec) {
  for (const char* spec : {"fp16", "onebit:block=4", "topk:k=1"})
    for (std::size_t n : {0, 1, 2, 5})
      for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce}) {
        SCOPED_TRACE(std::string(spec) + " n=" + std::to_string(n) + " " + to_string(a));
        const auto res = run_once(3, n, spec, a);
        for (int r = 1; r < 3; ++r)
          EXPECT_EQ(fingerprint(res[static_cast<std::size_t>(r)].out.data(), n), fingerprint(res[0].out.data(), n));
      }
}

TEST(Allreduce, AverageIsSumTimesReciprocal) {
  const std::size_t n = 257;
  const auto sum = run_once(4, n, "none", Algorithm::ScatterReduce, ReduceOp::Sum, true);
  const auto avg = run_once(4, n, "none", Algorithm::ScatterReduce, ReduceOp::Average, true);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(avg[0].out[i], sum[0].out[i] * 0.25f);
}

TEST(Allreduce, WireBytesAndWorkspaceStayWithinTheBound) {
  const std::size_t n = 100003;
  for (const char* spec : {"none", "fp16", "onebit", "topk:density=0.01"})
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce}) {
      const int P = 4;
      const auto res = run_once(P, n, spec, a);
      auto codec = make_codec(spec);
      const std::size_t C = codec->max_payload_bytes(n);
      const std::size_t bound = (P + 1) * C + 4 * ((n + P - 1) / P) + 4096;
      EXPECT_LE(res[0].comm_bytes, bound) << spec << " " << to_string(a);
      EXPECT_EQ(res[0].comm_bytes, AllreduceWorkspace::comm_bytes_for(*codec, n, P, 0, a));
      // Bytes on the wire: (P-1) payloads (allgather), 2(P-1)/P payloads
      // (scatter_reduce; each chunk's payload has its own header and rounding).
      const double payloads = static_cast<double>(res[0].stats.wire_bytes) / static_cast<double>(C);
      if (a == Algorithm::Allgather)
        EXPECT_NEAR(payloads, P - 1, 0.01) << spec;
      else
        EXPECT_NEAR(payloads, 2.0 * (P - 1) / P, 0.03) << spec;
    }
}

// Error feedback: the running sum of the outputs tracks the running sum of
// the exact results, however lossy one step is.
TEST(Allreduce, ErrorFeedbackConvergesToTheRunningSum) {
  const int P = 3, steps = 300, early = 100;
  const std::size_t n = 2000;
  for (const char* spec : {"topk:density=0.01", "onebit"})
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce}) {
      std::array<double, 2> err{};
      double err_early = 0;
      for (int ef = 0; ef < 2; ++ef) {
        const std::string s = std::string(spec) + (ef ? "" : (std::string(spec).find(':') == std::string::npos ? ":ef=off" : ",ef=off"));
        std::vector<double> got_sum(n), exact_total(n);
        std::mutex mu;
        const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
          auto codec = make_codec(s);
          AllreduceWorkspace ws;
          AllreduceState state;
          for (int step = 0; step < steps; ++step) {
            auto buf = make_input(r, n, step);
            AllreduceOptions o;
            o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = &state;
            o.buffer = buf.data(); o.n = n; o.algorithm = a; o.timeout = Timeout(20000);
            allreduce(o);
            if (r == 0) {
              std::lock_guard lock(mu);
              const auto ex = exact_sum(P, n, step);
              for (std::size_t i = 0; i < n; ++i) {
                got_sum[i] += buf[i];
                exact_total[i] += ex[i];
              }
              if (ef && step + 1 == early) err_early = rel_error(got_sum, exact_total);
            }
          }
        });
        for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
        err[static_cast<std::size_t>(ef)] = rel_error(got_sum, exact_total);
      }
      SCOPED_TRACE(std::string(spec) + " " + to_string(a));
      // With EF the running sum misses only what the residuals hold, which
      // stays bounded: its relative error shrinks as the sum grows.
      EXPECT_LT(err[1], 0.3) << "with EF";
      EXPECT_LT(err[1], 0.6 * err_early) << "EF error must shrink over steps (" << err_early << " -> " << err[1] << ")";
      EXPECT_LT(err[1], 0.5 * err[0]) << "EF must beat no EF (" << err[1] << " vs " << err[0] << ")";
    }
}

TEST(Allreduce, MismatchFailsOnEveryRankNamingIt) {
  const int P = 3;
  std::vector<std::string> messages(P);
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(r == 2 ? "fp16" : "none");
    AllreduceWorkspace ws;
    AllreduceState state;
    std::vector<float> buf(r == 1 ? 50 : 100, 1.0f);
    AllreduceOptions o;
    o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = &state;
    o.buffer = buf.data(); o.n = buf.size(); o.timeout = Timeout(20000);
    allreduce(o);
  });
  for (int r = 0; r < P; ++r) {
    const std::string m = what(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(m.find("disagree"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("codec: ranks 0,1 'none'; rank 2 'fp16'"), std::string::npos) << m;
    EXPECT_NE(m.find("n: ranks 0,2 '100'; rank 1 '50'"), std::string::npos) << m;
  }
}

TEST(Allreduce, SecondCallDoesNotAgreeOrAllocateAgain) {
  const int P = 2;
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("onebit");
    AllreduceWorkspace ws;
    AllreduceState state;
    auto buf = make_input(r, 1000);
    AllreduceStats stats;
    AllreduceOptions o;
    o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = &state;
    o.buffer = buf.data(); o.n = buf.size(); o.timeout = Timeout(20000); o.stats = &stats;
    allreduce(o);
    EXPECT_TRUE(stats.agreed);
    const std::size_t bytes = ws.bytes();
    allreduce(o);
    EXPECT_FALSE(stats.agreed);
    EXPECT_EQ(ws.bytes(), bytes);
    o.op = ReduceOp::Average;  // a new signature: agree again
    allreduce(o);
    EXPECT_TRUE(stats.agreed);
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

TEST(AllreduceState, SaveRestoreContinuesBitIdentically) {
  const int P = 3;
  const std::size_t n = 1001;
  for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce}) {
    std::vector<std::uint64_t> straight(P), resumed(P);
    for (int mode = 0; mode < 2; ++mode) {
      const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
        auto codec = make_codec("topk:density=0.02");
        AllreduceWorkspace ws;
        auto state = std::make_unique<AllreduceState>();
        std::vector<float> buf;
        auto step = [&](int s) {
          buf = make_input(r, n, s);
          AllreduceOptions o;
          o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = state.get();
          o.buffer = buf.data(); o.n = n; o.algorithm = a; o.timeout = Timeout(20000);
          allreduce(o);
        };
        for (int s = 0; s < 5; ++s) step(s);
        if (mode == 1) {  // checkpoint, drop everything, restore into a new state
          const std::string saved = state->save();
          state = std::make_unique<AllreduceState>();
          state->restore(saved);
        }
        for (int s = 5; s < 10; ++s) step(s);
        (mode ? resumed : straight)[static_cast<std::size_t>(r)] = fingerprint(buf.data(), n);
      });
      for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
    }
    EXPECT_EQ(straight, resumed) << to_string(a);
  }
}

// Saved bytes changed after the fact: the checksum catches damage; with the
// checksum made right again (a deliberate edit), every field is still
// checked: non-finite residuals, n = 2^62, a world of 2^32-1, a non-ASCII
// spec, an old version. Each is a clear InvalidArgument, never a
// length_error or an abort.
void expect_damaged_states_refused(const std::string& saved) {
  // Offsets in the fp16 state (n = 64, allgather): see allreduce_state.cc.
  const std::size_t spec_len = 4, spec = 12, n_at = spec + spec_len, world_at = n_at + 12;
  ASSERT_EQ(saved.substr(spec, spec_len), "fp16");
  const std::size_t residuals = world_at + 4 + 1 + 16;
  auto resum = [](std::string s) {
    s.resize(s.size() - 8);
    bytes::Writer(s).put(checksum64(s));
    return s;
  };
  auto refused = [](const std::string& bytes, const std::string& word) {
    try {
      AllreduceState().restore(bytes);
      return std::string("(accepted)");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      return m.find(word) != std::string::npos ? std::string() : m;
    }
  };
  auto with = [&](std::size_t at, const void* value, std::size_t size, bool fix_sum) {
    std::string s = saved;
    s.replace(at, size, static_cast<const char*>(value), size);
    return fix_sum ? resum(s) : s;
  };
  const float big = 3e38f, nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::uint64_t huge_n = std::uint64_t{1} << 62;
  const std::uint32_t huge_world = 0xFFFFFFFFu, old_version = 1;
  EXPECT_EQ(refused(with(residuals + 8, &big, 4, false), "checksum"), "");
  EXPECT_EQ(refused(with(residuals + 8, &nan, 4, true), "not finite"), "");
  EXPECT_EQ(refused(with(residuals, &inf, 4, true), "not finite"), "");
  EXPECT_EQ(refused(with(n_at, &huge_n, 8, true), "over the format's limit"), "");
  EXPECT_EQ(refused(with(world_at, &huge_world, 4, true), "world size"), "");
  EXPECT_EQ(refused(with(spec, "fp\xff" "6", 4, true), "printable"), "");
  EXPECT_EQ(refused(with(4, &old_version, 4, false), "version 1"), "");
}

TEST(AllreduceState, RejectsMismatchedOrMalformedRestores) {
  const auto errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("fp16");
    AllreduceWorkspace ws;
    AllreduceState state;
    std::vector<float> buf(64, 1.0f);
    AllreduceOptions o;
    o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = &state;
    o.buffer = buf.data(); o.n = buf.size(); o.timeout = Timeout(20000);
    allreduce(o);
    const std::string saved = state.save();

    AllreduceState other;  // bound to another n
    auto fp16 = make_codec("fp16");
    std::vector<float> small(32, 1.0f);
    o.state = &other; o.buffer = small.data(); o.n = small.size();
    allreduce(o);
    EXPECT_THROW(other.restore(saved), InvalidArgument);
    EXPECT_THROW(AllreduceState().restore(saved.substr(0, saved.size() - 1)), InvalidArgument);
    EXPECT_THROW(AllreduceState().restore("garbage"), InvalidArgument);
    EXPECT_THROW(AllreduceState().save(), InvalidArgument);
    expect_damaged_states_refused(saved);

    // A restored state used for another call shape is refused locally.
    AllreduceState restored;
    restored.restore(saved);
    o.state = &restored;
    EXPECT_THROW(allreduce(o), InvalidArgument);  // n = 32, saved for 64
    (void)r;
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

TEST(Agreement, TimesOutNamingTheMissingRanks) {
  HashStore store(Timeout(100));
  try {
    agree(store, 0, 0, 3, {{"n", "1"}}, Timeout(100));
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("agree/0/1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gz::test

// The allreduce algorithms with every rank a thread (ThreadTransport +
// HashStore): fast, many rank counts and sizes. The real multi-process runs
// over UCX are in mp_test.cc.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "comm/engine/agreement.h"
#include "comm/engine/allreduce.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "kernels/cast.h"
#include "tests/comm/collective_call.h"
#include "tests/comm/exchange_check.h"
#include "tests/comm/reference.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {
namespace {

struct RankResult {
  std::vector<float> out;
  AllreduceStats stats;
  std::size_t comm_bytes = 0;
};

struct Setting {
  ReduceOp op = ReduceOp::Sum;
  bool integer = false;          // integer-valued inputs: exact sums
  std::size_t segment_bytes = 0;
  const Topology* topology = nullptr;
  int steps = 1;                 // calls on the same state (inputs change per step); out is the last
  Sizes sizes = Sizes::Exact;    // Slot: the transport reports sizes as NCCL and torch do
};

// `steps` allreduces on `P` threads; returns each rank's last output.
std::vector<RankResult> run_steps(int P, std::size_t n, const std::string& spec, Algorithm algo, const Setting& set) {
  std::vector<RankResult> res(static_cast<std::size_t>(P));
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    ErrorFeedback state;
    auto& mine = res[static_cast<std::size_t>(r)];
    for (int step = 0; step < set.steps; ++step) {
      mine.out = make_input(r, n, step, set.integer);
      auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, mine.out);
      o.op = set.op;
      o.algorithm = algo;
      o.segment_bytes = set.segment_bytes;
      o.topology = set.topology;
      o.stats = &mine.stats;
      allreduce(o);
    }
    mine.comm_bytes = ws.comm_bytes();
  }, set.sizes);
  for (int r = 0; r < P; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], nullptr) << "rank " << r << ": " << what(errors[static_cast<std::size_t>(r)]);
  return res;
}

std::vector<RankResult> run_once(int P, std::size_t n, const std::string& spec, Algorithm algo,
                                 ReduceOp op = ReduceOp::Sum, bool integer = false) {
  Setting set;
  set.op = op;
  set.integer = integer;
  return run_steps(P, n, spec, algo, set);
}

std::vector<std::uint64_t> fingerprints(const std::vector<RankResult>& res) {
  std::vector<std::uint64_t> f;
  for (const auto& r : res) f.push_back(fingerprint(r.out.data(), r.out.size()));
  return f;
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
  // onebit's chunk sums go as fp16: allgather sends fewer bytes up to 15 ranks (block 512), 9 (block 64).
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, 4), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, 15), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, 16), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, parse_spec("onebit:block=64"), 9), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, parse_spec("onebit:block=64"), 10), Algorithm::ScatterReduce);
  // fp16 and bf16 from 3 ranks: the ring (scatter_reduce's bytes, ranked before it: its hops
  // re-encode with a rounding only); coarser codecs never get it from auto, nor none (its sums in
  // rank order are the fp32 reference).
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, parse_spec("fp16"), 3), Algorithm::Ring);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, parse_spec("bf16"), 8), Algorithm::Ring);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, none, 3), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, none, 2), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, parse_spec("qsgd:bits=8"), 8), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, topk, 8), Algorithm::Allgather);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, topk, 32), Algorithm::ScatterReduce);
  EXPECT_EQ(resolve_algorithm(Algorithm::Allgather, none, 8), Algorithm::Allgather);
  EXPECT_EQ(parse_algorithm("scatter_reduce"), Algorithm::ScatterReduce);
  EXPECT_EQ(parse_algorithm("ring"), Algorithm::Ring);
  EXPECT_THROW(parse_algorithm("butterfly"), InvalidArgument);
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
                                            ::testing::Values(Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring)));

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
                                            ::testing::Values(Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring)));

TEST(Allreduce, UnevenSizesWorkForEveryCodec) {
  for (const char* spec : {"fp16", "onebit:block=4", "topk:k=1"})
    for (std::size_t n : {0, 1, 2, 5})
      for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring}) {
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
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring}) {
      const int P = 4;
      const auto res = run_once(P, n, spec, a);
      auto codec = make_codec(spec);
      const std::size_t C = codec->max_payload_bytes(n);
      // scatter_reduce's chunk sums go in the server codec's payloads (onebit: fp16).
      const std::size_t S = make_codec(server_codec_config(codec->config()))->max_payload_bytes(n);
      const std::size_t bound = (P + 1) * std::max(C, S) + 4 * ((n + P - 1) / P) + 4096;
      EXPECT_LE(res[0].comm_bytes, bound) << spec << " " << to_string(a);
      EXPECT_EQ(res[0].comm_bytes, AllreduceWorkspace::comm_bytes_for(*codec, n, P, 0, a));
      // Bytes on the wire: (P-1) payloads (allgather), (P-1)/P payloads of
      // the codec and (P-1)/P of the server codec (scatter_reduce), within
      // what each segment's and chunk's payload adds (its own header, top-k's
      // rounding up of k): 1% each.
      const double wire = static_cast<double>(res[0].stats.wire_bytes);
      const double per_segment = 0.01 * static_cast<double>(res[0].stats.segments);
      if (a == Algorithm::Allgather)
        EXPECT_NEAR(wire / static_cast<double>(C), P - 1, per_segment) << spec;
      else
        EXPECT_NEAR(wire / static_cast<double>(C + S), (P - 1.0) / P, 3 * per_segment) << spec;
    }
}

// Error feedback: the running sum of the outputs tracks the running sum of
// the exact results, however lossy one step is; also when the calls are cut
// into segments (64-byte payloads: 3-4 segments here), where top-k selects
// per segment.
TEST(Allreduce, ErrorFeedbackConvergesToTheRunningSum) {
  const int P = 3, steps = 300, early = 100;
  const std::size_t n = 2000;
  for (const std::string spec : {"topk:density=0.01", "onebit"})
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring})
      for (std::size_t segment : {std::size_t{0}, std::size_t{64}}) {
        SCOPED_TRACE(spec + " " + to_string(a) + " segment " + std::to_string(segment));
        auto configure = [&](AllreduceOptions& o) {
          o.algorithm = a;
          o.segment_bytes = segment;
        };
        double err_early = 0;
        const double with_ef = running_sum_error<AllreduceOptions>(P, n, steps, spec, configure, early, &err_early);
        const double without = running_sum_error<AllreduceOptions>(P, n, steps, without_ef(spec), configure);
        // With EF the running sum misses only what the residuals hold, which
        // stays bounded: its relative error shrinks as the sum grows.
        EXPECT_LT(with_ef, 0.3) << "with EF";
        EXPECT_LT(with_ef, 0.6 * err_early) << "EF error must shrink over steps (" << err_early << " -> " << with_ef << ")";
        EXPECT_LT(with_ef, 0.5 * without) << "EF must beat no EF (" << with_ef << " vs " << without << ")";
      }
}

TEST(Allreduce, MismatchFailsOnEveryRankNamingIt) {
  const int P = 3;
  std::vector<std::string> messages(P);
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(r == 2 ? "fp16" : "none");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    std::vector<float> buf(r == 1 ? 50 : 100, 1.0f);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    allreduce(o);
  });
  for (int r = 0; r < P; ++r) {
    const std::string m = what(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(m.find("disagree"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("codec: ranks 0,1 'none'; rank 2 'fp16'"), std::string::npos) << m;
    EXPECT_NE(m.find("n: ranks 0,2 '100'; rank 1 '50'"), std::string::npos) << m;
  }
}

// 16-bit buffers: the call runs on the exact float widening and rounds the
// result once, so every rank holds the same bits, and those are the float
// allreduce of the widened inputs rounded to the dtype; the EF state is the
// float one, so a second step matches too.
TEST(Allreduce, SixteenBitBuffersAreTheFloatCallRoundedOnce) {
  struct Case {
    int P;
    const char* spec;
    Algorithm algo;
  };
  const Case cases[] = {{2, "onebit", Algorithm::Allgather},         {3, "topk:density=0.1", Algorithm::Allgather},
                        {3, "onebit:block=64", Algorithm::ScatterReduce}, {4, "none", Algorithm::ScatterReduce},
                        {3, "qsgd", Algorithm::ScatterReduce},        {2, "none", Algorithm::Allgather}};
  const std::size_t n = 5003;
  for (const Case& c : cases) {
    for (const Dtype dtype : {Dtype::Float16, Dtype::BFloat16}) {
      SCOPED_TRACE(std::string(c.spec) + " P=" + std::to_string(c.P) + " " + to_string(dtype));
      auto round16 = [&](float f) {
        return dtype == Dtype::Float16 ? kernels::half_from_float_rne(f) : kernels::bf16_from_float_rne(f);
      };
      auto widen16 = [&](std::uint16_t b) {
        return dtype == Dtype::Float16 ? kernels::half_to_float(b) : kernels::bf16_to_float(b);
      };
      std::vector<std::vector<std::uint16_t>> got(static_cast<std::size_t>(c.P));
      std::vector<std::vector<float>> want(static_cast<std::size_t>(c.P));
      const auto errors = run_threads(c.P, [&](int r, Transport& t, Store& store) {
        auto codec16 = make_codec(c.spec), codec32 = make_codec(c.spec);
        AllreduceWorkspace ws16, ws32;
        ErrorFeedback st16, st32;
        auto& mine16 = got[static_cast<std::size_t>(r)];
        auto& mine32 = want[static_cast<std::size_t>(r)];
        for (int step = 0; step < 2; ++step) {
          const std::vector<float> in = make_input(r, n, step);
          mine16.resize(n);
          mine32.resize(n);
          for (std::size_t i = 0; i < n; ++i) mine16[i] = round16(in[i]), mine32[i] = widen16(mine16[i]);
          AllreduceOptions o;
          o.transport = &t; o.store = &store; o.codec = codec16.get(); o.timeout = Timeout(20000);
          o.algorithm = c.algo; o.op = ReduceOp::Average; o.n = n;
          o.workspace = &ws16; o.state = &st16; o.buffer = mine16.data(); o.dtype = dtype;
          allreduce(o);
          o.codec = codec32.get(); o.workspace = &ws32; o.state = &st32; o.buffer = mine32.data();
          o.dtype = Dtype::Float32;
          allreduce(o);
        }
      });
      for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
      for (int r = 0; r < c.P; ++r) {
        const auto R = static_cast<std::size_t>(r);
        EXPECT_EQ(got[R], got[0]) << "rank " << r << " differs from rank 0";
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[R][i], round16(want[R][i])) << "rank " << r << " i=" << i;
      }
    }
  }
}

TEST(Allreduce, DtypeMismatchFailsOnEveryRankNamingIt) {
  const int P = 3;
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("onebit");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    std::vector<std::uint32_t> buf(100, 0x3F803F80u);  // 1.0 in bfloat16, or 200 of them; float: 100
    AllreduceOptions o;
    o.transport = &t; o.store = &store; o.workspace = &ws; o.codec = codec.get(); o.state = &state;
    o.buffer = buf.data(); o.n = 100; o.timeout = Timeout(20000);
    o.dtype = r == 1 ? Dtype::Float32 : Dtype::BFloat16;
    allreduce(o);
  });
  for (int r = 0; r < P; ++r) {
    const std::string m = what(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(m.find("dtype: ranks 0,2 'bfloat16'; rank 1 'float32'"), std::string::npos) << "rank " << r << ": " << m;
  }
}

TEST(Allreduce, SecondCallDoesNotAgreeOrAllocateAgain) {
  const int P = 2;
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("onebit");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    auto buf = make_input(r, 1000);
    AllreduceStats stats;
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    o.stats = &stats;
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

// The former name still compiles, as the same type (with a deprecation
// warning, silenced here: warnings are errors in this build).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<AllreduceState, ErrorFeedback>);
#pragma GCC diagnostic pop

// Also scatter_reduce's server residual (onebit: of its fp16 chunk sums).
TEST(ErrorFeedback, SaveRestoreContinuesBitIdentically) {
  const int P = 3;
  const std::size_t n = 1001;
  for (const char* spec : {"topk:density=0.02", "onebit:block=64"})
  for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring}) {
    std::vector<std::uint64_t> straight(P), resumed(P);
    for (int mode = 0; mode < 2; ++mode) {
      const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
        auto codec = make_codec(spec);
        AllreduceWorkspace ws;
        auto state = std::make_unique<ErrorFeedback>();
        std::vector<float> buf;
        auto step = [&](int s) {
          buf = make_input(r, n, s);
          auto o = call_options<AllreduceOptions>(t, store, ws, *codec, *state, buf);
          o.algorithm = a;
          allreduce(o);
        };
        for (int s = 0; s < 5; ++s) step(s);
        if (mode == 1) checkpoint(state);
        for (int s = 5; s < 10; ++s) step(s);
        (mode ? resumed : straight)[static_cast<std::size_t>(r)] = fingerprint(buf.data(), n);
      });
      for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
    }
    EXPECT_EQ(straight, resumed) << spec << " " << to_string(a);
  }
}

// Saved bytes changed after the fact: the checksum catches damage; with the
// checksum made right again (a deliberate edit), every field is still
// checked: non-finite residuals, finite ones so large that the next step
// overflows (3e38: every rank's result was inf), n = 2^62, a world of
// 2^32-1, a non-ASCII spec, an old version. Each is a clear
// InvalidArgument, never a length_error or an abort.
void expect_damaged_states_refused(const std::string& saved) {
  // Offsets in the fp16 state (n = 64, allgather): see error_feedback.cc.
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
      ErrorFeedback().restore(bytes);
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
  // The limit is 2^64 in magnitude (error_feedback.cc says why): 3e38 and the
  // float just over 2^64 are refused, 2^64 itself loads.
  const float limit = 0x1p64f, over = std::nextafter(limit, big), minus_big = -big;
  EXPECT_EQ(refused(with(residuals + 8, &big, 4, true), "element 2 is 3e+38, over the limit of 2^64"), "");
  EXPECT_EQ(refused(with(residuals, &minus_big, 4, true), "over the limit of 2^64"), "");
  EXPECT_EQ(refused(with(residuals + 4, &over, 4, true), "over the limit of 2^64"), "");
  ErrorFeedback at_limit;
  at_limit.restore(with(residuals + 8, &limit, 4, true));
  EXPECT_EQ(at_limit.residuals().first.at(2), limit);
  EXPECT_EQ(refused(with(n_at, &huge_n, 8, true), "over the format's limit"), "");
  EXPECT_EQ(refused(with(world_at, &huge_world, 4, true), "world size"), "");
  EXPECT_EQ(refused(with(spec, "fp\xff" "6", 4, true), "printable"), "");
  // Version 1 (AllreduceState's, before the checksum) is this layout without
  // the checksum: it loads, and saves again as this version, the same state
  // (issue 25); its fields are checked the same way.
  std::string v1 = saved.substr(0, saved.size() - 8);
  v1.replace(4, 4, reinterpret_cast<const char*>(&old_version), 4);
  ErrorFeedback old;
  old.restore(v1);
  EXPECT_EQ(old.save(), saved);
  auto v1_with = [&](std::size_t at, const void* value, std::size_t size) {
    std::string s = v1;
    s.replace(at, size, static_cast<const char*>(value), size);
    return s;
  };
  EXPECT_EQ(refused(v1_with(residuals, &inf, 4), "not finite"), "");
  EXPECT_EQ(refused(v1_with(residuals, &big, 4), "over the limit of 2^64"), "");
  EXPECT_EQ(refused(v1_with(n_at, &huge_n, 8), "over the format's limit"), "");
  EXPECT_EQ(refused(v1 + "x", "bytes of residuals"), "");
  EXPECT_EQ(refused(with(4, &old_version, 4, false), "bytes of residuals"), "");  // v2 bytes labelled 1
  const std::uint32_t future = 3;
  EXPECT_EQ(refused(with(4, &future, 4, false), "reads versions 1 and 2"), "");
}

TEST(ErrorFeedback, RejectsMismatchedOrMalformedRestores) {
  const auto errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("fp16");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    std::vector<float> buf(64, 1.0f);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    allreduce(o);
    const std::string saved = state.save();

    ErrorFeedback other;  // bound to another n
    auto fp16 = make_codec("fp16");
    std::vector<float> small(32, 1.0f);
    o.state = &other; o.buffer = small.data(); o.n = small.size();
    allreduce(o);
    EXPECT_THROW(other.restore(saved), InvalidArgument);
    EXPECT_THROW(ErrorFeedback().restore(saved.substr(0, saved.size() - 1)), InvalidArgument);
    EXPECT_THROW(ErrorFeedback().restore("garbage"), InvalidArgument);
    EXPECT_THROW(ErrorFeedback().save(), InvalidArgument);
    expect_damaged_states_refused(saved);

    // A restored state used for another call shape is refused locally.
    ErrorFeedback restored;
    restored.restore(saved);
    o.state = &restored;
    EXPECT_THROW(allreduce(o), InvalidArgument);  // n = 32, saved for 64
    (void)r;
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

// respec(): top-k's density changes (DGC's sparsity warm-up) with the
// residuals carried, not dropped; the next call agrees on the new codec.
// A codec with other residual sizes (none: no error feedback) and an unbound
// state are refused, leaving the state as it was.
TEST(ErrorFeedback, RespecKeepsTheResidualsAndTheNextCallUsesTheNewCodec) {
  const auto errors = run_threads(3, [&](int r, Transport& t, Store& store) {
    auto wide = make_codec("topk:density=0.2");
    auto narrow = make_codec("topk:density=0.05");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    EXPECT_THROW(state.respec("topk:density=0.05"), InvalidArgument);  // unbound
    EXPECT_THROW((void)state.residuals(), InvalidArgument);
    std::vector<float> buf = make_input(r, 300, 0, false);
    auto o = call_options<AllreduceOptions>(t, store, ws, *wide, state, buf);
    o.algorithm = Algorithm::ScatterReduce;
    allreduce(o);
    const auto before = state.residuals();
    EXPECT_EQ(before.first.size(), 300u);
    EXPECT_FALSE(before.second.empty());
    EXPECT_THROW(state.respec("none"), InvalidArgument);
    EXPECT_EQ(state.layout()->codec, "topk:density=0.2");
    state.respec("topk:density=0.050");
    EXPECT_EQ(state.layout()->codec, "topk:density=0.05");
    EXPECT_EQ(state.residuals(), before);
    // The wide codec's call is now refused locally; the narrow one runs on.
    const std::vector<float> next = make_input(r, 300, 1, false);
    std::copy(next.begin(), next.end(), buf.begin());  // o points into buf
    EXPECT_THROW(allreduce(o), InvalidArgument);
    o.codec = narrow.get();
    allreduce(o);
    EXPECT_NE(state.residuals(), before);
    // A restored state respecs too (its residuals still pending).
    ErrorFeedback restored;
    restored.restore(state.save());
    const auto saved = restored.residuals();
    restored.respec("topk:density=0.2");
    EXPECT_EQ(restored.residuals(), saved);
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

// torchft's quorum after rank 2 of 3 left: ranks 0 and 1 go on as a group
// of two. Without regroup() the states' layouts refuse the call; with it
// each rank's worker residual carries over as it was (the next allgather
// equals the codec's own encode of input + that residual, summed), and the
// server residual of its chunk of three starts from zeros.
TEST(ErrorFeedback, RegroupCarriesTheWorkerResidualIntoAGroupOfAnotherSize) {
  const std::string spec = "onebit:block=64";
  const std::size_t n = 300;
  std::array<ErrorFeedback, 3> states;
  std::array<std::vector<float>, 3> worker;
  auto errors = run_threads(3, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    std::vector<float> buf = make_input(r, n, 0, false);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, states[static_cast<std::size_t>(r)], buf);
    o.algorithm = Algorithm::ScatterReduce;
    allreduce(o);
    const auto [w, server] = states[static_cast<std::size_t>(r)].residuals();
    EXPECT_FALSE(server.empty());
    worker[static_cast<std::size_t>(r)] = w;
  });
  for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);

  std::array<std::vector<float>, 2> got;
  errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    ErrorFeedback& state = states[static_cast<std::size_t>(r)];
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    auto& buf = got[static_cast<std::size_t>(r)];
    buf = make_input(r, n, 1, false);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    o.algorithm = Algorithm::Allgather;
    EXPECT_THROW(allreduce(o), InvalidArgument);  // bound to rank r of 3 under scatter_reduce
    state.regroup();
    EXPECT_EQ(state.layout()->world, 3u);  // the old layout until the next call
    const auto [w, server] = state.residuals();
    EXPECT_EQ(w, worker[static_cast<std::size_t>(r)]);
    EXPECT_EQ(server, std::vector<float>(server.size(), 0.0f));
    allreduce(o);
    EXPECT_EQ(state.layout()->world, 2u);
    EXPECT_EQ(state.layout()->rank, static_cast<std::uint32_t>(r));
    EXPECT_EQ(state.layout()->server_count, 0u);
  });
  for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);

  auto codec = make_codec(spec);
  std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PayloadRef> refs;
  for (int q = 0; q < 2; ++q) {
    const auto in = make_input(q, n, 1, false);
    auto& p = payloads.emplace_back(codec->max_payload_bytes(n));
    refs.push_back({p.data(), codec->encode(in.data(), worker[static_cast<std::size_t>(q)].data(), n, p.data(),
                                            p.size(), ctx)});
  }
  std::vector<float> want(n, 0.0f);
  codec->decode_sum(refs, want.data(), n, 1.0f, ctx);
  for (const auto& buf : got) EXPECT_EQ(fingerprint(buf.data(), n), fingerprint(want.data(), n));
}

// torchft's healed replica: one rank zeroes its residuals, the others do
// nothing. The next call needs no agreement round (a fresh state on one
// rank alone would wait for the others' records), and rank 0 sends what a
// fresh state sends.
TEST(ErrorFeedback, ZeroOnOneRankKeepsTheAgreementAndSendsAsAFreshState) {
  const std::string spec = "qsgd:bits=2,bucket=64";
  const std::size_t n = 300;
  std::array<ErrorFeedback, 2> states;
  std::vector<float> rank1;  // rank 1's worker residual before the second call
  std::array<std::vector<float>, 2> got;
  const auto errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    ErrorFeedback& state = states[static_cast<std::size_t>(r)];
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    auto& buf = got[static_cast<std::size_t>(r)];
    buf = make_input(r, n, 0, false);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    o.algorithm = Algorithm::Allgather;
    allreduce(o);
    if (r == 0) {
      state.zero();
      const auto [w, server] = state.residuals();
      EXPECT_EQ(w, std::vector<float>(n, 0.0f));
      EXPECT_EQ(state.layout()->world, 2u);
    } else {
      rank1 = state.residuals().first;
    }
    o.timeout = Timeout(3000);  // an agreement round on one rank alone would end here
    const std::vector<float> next = make_input(r, n, 1, false);
    std::copy(next.begin(), next.end(), buf.begin());  // o points into buf
    allreduce(o);
  });
  for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
  auto codec = make_codec(spec);
  std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  std::array<std::vector<float>, 2> residual{std::vector<float>(n, 0.0f), rank1};
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PayloadRef> refs;
  for (int q = 0; q < 2; ++q) {
    const auto in = make_input(q, n, 1, false);
    auto& p = payloads.emplace_back(codec->max_payload_bytes(n));
    refs.push_back({p.data(), codec->encode(in.data(), residual[static_cast<std::size_t>(q)].data(), n, p.data(),
                                            p.size(), ctx)});
  }
  std::vector<float> want(n, 0.0f);
  codec->decode_sum(refs, want.data(), n, 1.0f, ctx);
  for (const auto& buf : got) EXPECT_EQ(fingerprint(buf.data(), n), fingerprint(want.data(), n));
}

TEST(Transport, ExchangesMatchPerPairInPostingOrder) {
  for (int P : {2, 3, 5}) {
    std::vector<std::string> broke(static_cast<std::size_t>(P));
    const auto errors = run_threads(P, [&](int r, Transport& t, Store&) {
      broke[static_cast<std::size_t>(r)] = check_exchanges(t, Timeout(20000));
    });
    for (int r = 0; r < P; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], nullptr) << what(errors[static_cast<std::size_t>(r)]);
      EXPECT_EQ(broke[static_cast<std::size_t>(r)], "") << "P=" << P << " rank " << r;
    }
  }
}

// Pipelining changes no bit: for codecs whose payload does not depend on
// where a segment starts (none, fp16, bf16, onebit with segments on block
// boundaries) any segment size gives the unsegmented result, over two EF
// steps, for every rank count and uneven sizes (n < P, n % P != 0, a
// segment longer than n); and every rank holds the same bits.
class Segmented : public ::testing::TestWithParam<std::tuple<std::string, Algorithm>> {};

TEST_P(Segmented, SameBitsAsUnsegmented) {
  const auto [spec, algo] = GetParam();
  for (int P : {1, 2, 3, 4})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}, std::size_t{100003}}) {
      Setting whole;
      whole.steps = 2;
      whole.op = ReduceOp::Average;
      whole.segment_bytes = std::size_t{1} << 40;
      const auto want = fingerprints(run_steps(P, n, spec, algo, whole));
      for (std::size_t r = 1; r < want.size(); ++r) EXPECT_EQ(want[r], want[0]) << spec << " rank " << r;
      for (std::size_t seg : {std::size_t{1}, std::size_t{4096}, std::size_t{50000}}) {
        SCOPED_TRACE(spec + " " + to_string(algo) + " P=" + std::to_string(P) + " n=" + std::to_string(n) +
                     " segment=" + std::to_string(seg));
        Setting cut = whole;
        cut.segment_bytes = seg;
        const auto res = run_steps(P, n, spec, algo, cut);
        EXPECT_EQ(fingerprints(res), want);
        if (n == 100003 && seg == 1) {
          EXPECT_GT(res[0].stats.segments, 10u) << "not cut into segments";
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Segmented,
                         ::testing::Combine(::testing::Values("none", "fp16", "bf16", "onebit", "onebit:block=100",
                                                              "onebit:block=7,ef=off"),
                                            ::testing::Values(Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring)),
                         [](const auto& param_info) {
                           std::string s = std::get<0>(param_info.param) + "_" + to_string(std::get<1>(param_info.param));
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// A transport that reports only each receive's own size and needs every send
// as large as its receive (NCCL, torch's process group) gives the bits the
// exact-size one gives: every codec and algorithm, uneven chunks, a last
// segment shorter than the rest, n < P.
TEST(Allreduce, TransportsWithoutExactSizesGiveTheSameBits) {
  for (const char* spec : {"none", "fp16", "onebit", "topk:density=0.01", "topk:density=0.05,select=sample"})
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring})
      for (int P : {2, 3})
        for (std::size_t n : {std::size_t{2}, std::size_t{1001}, std::size_t{40009}}) {
          SCOPED_TRACE(std::string(spec) + " " + to_string(a) + " P=" + std::to_string(P) + " n=" + std::to_string(n));
          Setting exact;
          exact.steps = 2;
          exact.segment_bytes = 1000;
          Setting slot = exact;
          slot.sizes = Sizes::Slot;
          EXPECT_EQ(fingerprints(run_steps(P, n, spec, a, slot)), fingerprints(run_steps(P, n, spec, a, exact)));
        }
}

// Top-k selects per segment (k split by the spec's rate), so the bits depend
// on the segment size; what must hold: identical ranks, the error bound.
TEST(Segmented, TopkIsIdenticalOnAllRanksAndWithinBound) {
  for (const char* spec : {"topk:density=0.01", "topk:k=50", "topk:density=0.05,select=sample"})
    for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring})
      for (std::size_t seg : {std::size_t{64}, std::size_t{1000}}) {
        SCOPED_TRACE(std::string(spec) + " " + to_string(a) + " segment=" + std::to_string(seg));
        Setting cut;
        cut.segment_bytes = seg;
        const std::size_t n = 40009;
        const auto res = run_steps(3, n, spec, a, cut);
        if (seg == 64) {
          EXPECT_GT(res[0].stats.segments, 1u);
        }
        const auto f = fingerprints(res);
        for (auto x : f) EXPECT_EQ(x, f[0]);
        EXPECT_LE(rel_error(res[0].out, exact_sum(3, n)), allreduce_error_bound(parse_spec(spec)));
      }
}

// Where the time went: encode and decode ran, comm spans them, the waits are
// part of comm, and total is no less than the wait.
TEST(Allreduce, PipelineStatsAreConsistent) {
  Setting cut;
  cut.segment_bytes = 4096;
  for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Ring}) {
    const auto res = run_steps(2, 100003, "onebit", a, cut);
    const AllreduceStats& st = res[0].stats;
    EXPECT_GE(st.segments, 2u);
    EXPECT_GT(st.encode_s, 0.0);
    EXPECT_GT(st.decode_s, 0.0);
    EXPECT_LE(st.wait_s, st.comm_s + 1e-6);
    EXPECT_LE(st.comm_s, st.total_s + 1e-6);
    EXPECT_EQ(st.algorithm, a);
  }
}

// hierarchical: exact for none (every node size and count, uneven sizes,
// sum and average), the same bits on every rank.
TEST(Hierarchical, NoneIsExactForEveryLayout) {
  for (auto [P, L] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}, std::pair{2, 1}, std::pair{2, 2}}) {
    const Topology topo = Topology::blocks(P, L);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001}, std::size_t{100003}})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        SCOPED_TRACE(topo.describe() + " n=" + std::to_string(n) + " " + to_string(op));
        Setting set;
        set.op = op;
        set.integer = true;
        set.topology = &topo;
        set.segment_bytes = 4096;
        const auto res = run_steps(P, n, "none", Algorithm::Hierarchical, set);
        const auto exact = exact_sum(P, n, 0, true);
        const float scale = op == ReduceOp::Sum ? 1.0f : 1.0f / static_cast<float>(P);
        for (int r = 0; r < P; ++r) {
          ASSERT_EQ(res[static_cast<std::size_t>(r)].stats.algorithm, Algorithm::Hierarchical);
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(res[static_cast<std::size_t>(r)].out[i], static_cast<float>(exact[i]) * scale)
                << "rank " << r << " i " << i;
        }
      }
  }
}

// Lossy codecs: every rank (the shard's owner and its node partners, which
// decode the owner's payloads themselves) gets the same bits, within the
// bound, no worse than flat; across 2 nodes (allgather between them) and 3
// (scatter_reduce), in one segment or many.
TEST(Hierarchical, LossyCodecsAreIdenticalWithinBoundAndNoWorseThanFlat) {
  const std::size_t n = 40009;
  for (auto [P, L] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}})
    for (const char* spec : {"fp16", "onebit", "topk:density=0.01", "topk:density=0.05,select=sample"})
    for (std::size_t segment : {std::size_t{0}, std::size_t{256}}) {
      SCOPED_TRACE(std::string(spec) + " P=" + std::to_string(P) + " L=" + std::to_string(L) + " segment " +
                   std::to_string(segment));
      const Topology topo = Topology::blocks(P, L);
      Setting set;
      set.topology = &topo;
      set.segment_bytes = segment;
      set.steps = 2;
      set.op = ReduceOp::Average;
      const auto res = run_steps(P, n, spec, Algorithm::Auto, set);
      ASSERT_EQ(res[0].stats.algorithm, Algorithm::Hierarchical);
      if (segment) {
        EXPECT_GT(res[0].stats.segments, 2u);
      }
      const auto f = fingerprints(res);
      for (auto x : f) EXPECT_EQ(x, f[0]);
      if (segment) continue;  // the error of one call, from zero state:
      const auto first = run_steps(P, n, spec, Algorithm::Auto, Setting{ReduceOp::Sum, false, 0, &topo, 1});
      const double err = rel_error(first[0].out, exact_sum(P, n));
      EXPECT_LE(err, allreduce_error_bound(parse_spec(spec)));
      // Compressing only across nodes (one compression of a node's sum)
      // loses about what compressing every rank's values once does (flat
      // scatter_reduce: its chunk sums go in the server codec, fp16 for
      // onebit); with two lossy compressions it lost more (docs/comm.md).
      // loses no more than compressing everything (for the codecs that lose
      // much; fp16's rounding noise goes either way).
      if (std::string(spec) == "fp16") continue;
      const double flat = rel_error(run_once(P, n, spec, Algorithm::ScatterReduce)[0].out, exact_sum(P, n));
      EXPECT_LE(err, flat * 1.05) << "hierarchical " << err << " vs flat scatter_reduce " << flat;
    }
}

TEST(Hierarchical, ErrorFeedbackConvergesToTheRunningSum) {
  const Topology topo = Topology::blocks(4, 2);
  for (const char* spec : {"onebit", "topk:density=0.01"}) {
    const double err = running_sum_error<AllreduceOptions>(4, 2000, 200, spec, [&](AllreduceOptions& o) {
      o.algorithm = Algorithm::Hierarchical;
      o.topology = &topo;
      o.segment_bytes = 64;
    });
    EXPECT_LT(err, 0.3) << spec;
  }
}

TEST(Hierarchical, AutoPicksItForSeveralNodesOfSeveralRanks) {
  const auto onebit = parse_spec("onebit"), topk = parse_spec("topk");
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, Topology::blocks(4, 2)), Algorithm::Hierarchical);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, topk, Topology::blocks(8, 4)), Algorithm::Hierarchical);
  const auto fp16 = parse_spec("fp16");  // else the flat rule: the ring for fp16, allgather for onebit
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, fp16, Topology::blocks(4, 2)), Algorithm::Hierarchical);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, fp16, Topology::blocks(4, 4)), Algorithm::Ring);  // one node
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, fp16, Topology::flat(4)), Algorithm::Ring);
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, fp16, Topology{{0, 0, 1}}), Algorithm::Ring);  // uneven
  EXPECT_EQ(resolve_algorithm(Algorithm::Auto, onebit, Topology::flat(4)), Algorithm::Allgather);
  EXPECT_THROW(resolve_algorithm(Algorithm::Hierarchical, onebit, Topology{{0, 0, 1}}), InvalidArgument);
  EXPECT_EQ(parse_algorithm("hierarchical"), Algorithm::Hierarchical);
}

// A state saved from a hierarchical run restores and continues bit-identically.
TEST(Hierarchical, SaveRestoreContinuesBitIdentically) {
  const int P = 4;
  const std::size_t n = 1001;
  const Topology topo = Topology::blocks(P, 2);
  std::vector<std::uint64_t> straight(P), resumed(P);
  for (int mode = 0; mode < 2; ++mode) {
    const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
      auto codec = make_codec("onebit");
      AllreduceWorkspace ws;
      auto state = std::make_unique<ErrorFeedback>();
      std::vector<float> buf;
      for (int s = 0; s < 6; ++s) {
        if (mode == 1 && s == 3) checkpoint(state);
        buf = make_input(r, n, s);
        auto o = call_options<AllreduceOptions>(t, store, ws, *codec, *state, buf);
        o.algorithm = Algorithm::Hierarchical;
        o.topology = &topo;
        allreduce(o);
      }
      (mode ? resumed : straight)[static_cast<std::size_t>(r)] = fingerprint(buf.data(), n);
    });
    for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
  }
  EXPECT_EQ(straight, resumed);
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

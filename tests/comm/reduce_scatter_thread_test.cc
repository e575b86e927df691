// The reduce_scatter collective with every rank a thread (ThreadTransport +
// HashStore), against a reference built from the codec itself: rank q's
// payload of chunk j is encode(chunk j of q's input, q's residual), and rank
// j's result is decode_sum of those payloads in rank order. With one segment
// per chunk the collective must give exactly those bits; segmented, the same
// bits for codecs whose payload does not depend on where a segment starts.
#include <gtest/gtest.h>

#include "comm/engine/reduce_scatter.h"
#include "tests/comm/collective_call.h"
#include "tests/comm/reference.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {
namespace {

constexpr std::size_t kOneSegment = std::size_t{1} << 40;

struct Setting {
  ReduceOp op = ReduceOp::Sum;
  bool integer = false;
  std::size_t segment_bytes = kOneSegment;
  int steps = 1;
  int restore_at = -1;  // save, drop and restore every state before this step
  Sizes sizes = Sizes::Exact;
};

struct RankResult {
  std::vector<float> buffer;  // the whole buffer after the last step
  AllreduceStats stats;
};

std::vector<float> chunk_of(const std::vector<float>& v, std::size_t n, int P, int j) {
  const ChunkRange c = chunk_range(n, P, j);
  return {v.begin() + static_cast<std::ptrdiff_t>(c.offset), v.begin() + static_cast<std::ptrdiff_t>(c.offset + c.count)};
}

// `steps` reduce-scatters on P threads; each rank's buffer after the last.
std::vector<RankResult> run(int P, std::size_t n, const std::string& spec, const Setting& set) {
  std::vector<RankResult> res(static_cast<std::size_t>(P));
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    auto state = std::make_unique<ErrorFeedback>();
    auto& mine = res[static_cast<std::size_t>(r)];
    for (int step = 0; step < set.steps; ++step) {
      if (step == set.restore_at) checkpoint(state);
      mine.buffer = make_input(r, n, step, set.integer);
      auto o = call_options<ReduceScatterOptions>(t, store, ws, *codec, *state, mine.buffer);
      o.op = set.op;
      o.segment_bytes = set.segment_bytes;
      o.stats = &mine.stats;
      reduce_scatter(o);
    }
  }, set.sizes);
  for (int r = 0; r < P; ++r)
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], nullptr) << "rank " << r << ": " << what(errors[static_cast<std::size_t>(r)]);
  return res;
}

// The reference: chunk j's result after `steps` steps, from the codec's own
// encode and decode_sum, one payload per rank and chunk.
std::vector<std::vector<float>> reference(int P, std::size_t n, const std::string& spec, const Setting& set) {
  auto codec = make_codec(spec);
  std::vector<std::vector<float>> residual(static_cast<std::size_t>(P), std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> out(static_cast<std::size_t>(P));
  std::vector<std::byte> ws(codec->workspace_bytes(n, Device::Cpu));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  const float scale = set.op == ReduceOp::Average ? 1.0f / static_cast<float>(P) : 1.0f;
  for (int step = 0; step < set.steps; ++step)
    for (int j = 0; j < P; ++j) {
      const ChunkRange c = chunk_range(n, P, j);
      std::vector<std::vector<std::byte>> payloads;
      std::vector<PayloadRef> refs;
      for (int q = 0; q < P; ++q) {
        const auto in = make_input(q, n, step, set.integer);
        auto& p = payloads.emplace_back(codec->max_payload_bytes(c.count));
        float* ef = codec->error_feedback() ? residual[static_cast<std::size_t>(q)].data() + c.offset : nullptr;
        const std::size_t bytes = codec->encode(in.data() + c.offset, ef, c.count, p.data(), p.size(), ctx);
        refs.push_back({p.data(), bytes});
      }
      auto& o = out[static_cast<std::size_t>(j)];
      o.assign(c.count, 0.0f);
      codec->decode_sum(refs, o.data(), c.count, scale, ctx);
    }
  return out;
}

// Every rank's own chunk equals the reference bit for bit, and the other
// chunks of its buffer are its input, untouched.
void expect_reference(int P, std::size_t n, const std::string& spec, const Setting& set) {
  const auto got = run(P, n, spec, set);
  const auto want = reference(P, n, spec, set);
  for (int r = 0; r < P; ++r) {
    const auto& buf = got[static_cast<std::size_t>(r)].buffer;
    ASSERT_EQ(buf.size(), n);
    const auto own = chunk_of(buf, n, P, r);
    const auto& ref = want[static_cast<std::size_t>(r)];
    ASSERT_EQ(own.size(), ref.size());
    EXPECT_EQ(fingerprint(own.data(), own.size()), fingerprint(ref.data(), ref.size())) << "rank " << r;
    const auto input = make_input(r, n, set.steps - 1, set.integer);
    for (int j = 0; j < P; ++j) {
      if (j == r) continue;
      EXPECT_EQ(chunk_of(buf, n, P, j), chunk_of(input, n, P, j)) << "rank " << r << " wrote into chunk " << j;
    }
    EXPECT_EQ(got[static_cast<std::size_t>(r)].stats.algorithm, Algorithm::ReduceScatter);
  }
}

TEST(ReduceScatter, NoneIsTheExactSumOfEachChunk) {
  for (int P : {1, 2, 3, 4, 5})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{1001},
                          std::size_t{4096}}) {
      SCOPED_TRACE("P=" + std::to_string(P) + " n=" + std::to_string(n));
      Setting set;
      set.integer = true;  // integer inputs: the sum is exact in fp32
      const auto got = run(P, n, "none", set);
      const auto exact = exact_sum(P, n, 0, true);
      for (int r = 0; r < P; ++r) {
        const ChunkRange c = chunk_range(n, P, r);
        const auto& buf = got[static_cast<std::size_t>(r)].buffer;
        for (std::size_t i = 0; i < c.count; ++i)
          ASSERT_EQ(buf[c.offset + i], static_cast<float>(exact[c.offset + i])) << "rank " << r << " i " << i;
      }
    }
}

// Every codec, sum and average, uneven chunks (n % P != 0, n < P), two EF
// steps: the codec's own reference, bit for bit.
TEST(ReduceScatter, EqualsTheCodecsOwnReference) {
  for (const std::string spec : {"none", "fp16", "bf16", "onebit", "topk:density=0.05", "qsgd", "fp8"})
    for (int P : {2, 3, 4})
      for (std::size_t n : {std::size_t{2}, std::size_t{1001}, std::size_t{8192}})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
          SCOPED_TRACE(spec + " P=" + std::to_string(P) + " n=" + std::to_string(n) + " op=" + to_string(op));
          Setting set;
          set.op = op;
          set.steps = 2;
          expect_reference(P, n, spec, set);
        }
}

// Segments change no bit for codecs whose payload does not depend on where a
// segment starts; a transport without exact sizes (torch's process group)
// changes none either.
TEST(ReduceScatter, SegmentsAndSlotSizedTransportsGiveTheSameBits) {
  for (const std::string spec : {"none", "fp16", "onebit", "onebit:block=100"})
    for (int P : {2, 3}) {
      const std::size_t n = 100003;
      Setting whole;
      whole.steps = 2;
      whole.op = ReduceOp::Average;
      const auto want = run(P, n, spec, whole);
      for (std::size_t seg : {std::size_t{1}, std::size_t{4096}}) {
        for (Sizes sizes : {Sizes::Exact, Sizes::Slot}) {
          SCOPED_TRACE(spec + " P=" + std::to_string(P) + " segment=" + std::to_string(seg));
          Setting cut = whole;
          cut.segment_bytes = seg;
          cut.sizes = sizes;
          const auto got = run(P, n, spec, cut);
          for (int r = 0; r < P; ++r) {
            const auto& a = got[static_cast<std::size_t>(r)].buffer;
            const auto& b = want[static_cast<std::size_t>(r)].buffer;
            EXPECT_EQ(fingerprint(a.data(), n), fingerprint(b.data(), n)) << "rank " << r;
          }
          if (seg == 1) {
            EXPECT_GT(got[0].stats.segments, 10u) << "not cut into segments";
          }
        }
      }
    }
}

// Bytes: every other rank's chunk, once: (P-1)/P of the buffer's payloads,
// half of what the scatter_reduce allreduce sends.
TEST(ReduceScatter, SendsEachOtherRanksChunkOnce) {
  const int P = 4;
  const std::size_t n = 4099;
  const auto got = run(P, n, "none", Setting{});
  for (int r = 0; r < P; ++r) {
    std::size_t want = 0;
    for (int j = 0; j < P; ++j)
      if (j != r) want += 4 * chunk_range(n, P, j).count;
    EXPECT_EQ(got[static_cast<std::size_t>(r)].stats.wire_bytes, want) << "rank " << r;
  }
  const auto onebit = run(P, n, "onebit", Setting{});
  EXPECT_LT(onebit[0].stats.wire_bytes * 20, got[0].stats.wire_bytes);
}

// Error feedback: the running sum of every rank's chunk results tracks the
// exact running sum (collective_call.h), and much better than without EF.
TEST(ReduceScatter, ErrorFeedbackConvergesToTheRunningSum) {
  for (const std::string spec : {"onebit", "topk:density=0.01"}) {
    SCOPED_TRACE(spec);
    const double with_ef = running_sum_error<ReduceScatterOptions>(3, 2000, 200, spec);
    const double without = running_sum_error<ReduceScatterOptions>(3, 2000, 200, without_ef(spec));
    // The running sum misses only what the residuals hold, which stays
    // bounded while the sum grows (the thresholds of the allreduce's test).
    EXPECT_LT(with_ef, 0.3);
    EXPECT_LT(with_ef, 0.5 * without) << with_ef << " vs " << without;
    RecordProperty("rel_error_" + spec, std::to_string(with_ef) + " (no EF " + std::to_string(without) + ")");
  }
}

// A checkpoint mid-run (save, drop the state, restore into a new one)
// continues bit-identically: the same reference after 6 steps.
TEST(ReduceScatter, RestoredStateContinuesBitIdentically) {
  for (const std::string spec : {"onebit", "topk:density=0.02"}) {
    SCOPED_TRACE(spec);
    Setting set;
    set.steps = 6;
    set.restore_at = 3;
    expect_reference(3, 1001, spec, set);
  }
}

TEST(ReduceScatter, MismatchedCallsFailOnEveryRankNamingThem) {
  const int P = 3;
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(r == 2 ? "onebit" : "none");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    std::vector<float> buf(r == 1 ? 60 : 90, 1.0f);
    reduce_scatter(call_options<ReduceScatterOptions>(t, store, ws, *codec, state, buf));
  });
  for (int r = 0; r < P; ++r) {
    const std::string m = what(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(m.find("codec: ranks 0,1 'none'; rank 2 'onebit"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("n: ranks 0,2 '90'; rank 1 '60'"), std::string::npos) << m;
  }
}

// A rank calling allreduce while the others call reduce_scatter: every rank
// fails, naming the collective, instead of a hang or a wrong sum.
TEST(ReduceScatter, AgainstAnAllreduceFailsOnEveryRank) {
  const int P = 2;
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("none");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    std::vector<float> buf(64, 1.0f);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    o.algorithm = Algorithm::ScatterReduce;
    if (r == 0) {
      allreduce(o);
    } else {
      reduce_scatter(call_options<ReduceScatterOptions>(t, store, ws, *codec, state, buf));
    }
  });
  for (int r = 0; r < P; ++r) {
    const std::string m = what(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(m.find("algorithm: rank 0 'scatter_reduce'; rank 1 'reduce_scatter'"), std::string::npos)
        << "rank " << r << ": " << m;
  }
}

TEST(ReduceScatter, RefusesAnAllreducesStateAndAllreduceRefusesIt) {
  const auto errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("onebit");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    auto buf = make_input(r, 256);
    auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
    allreduce(o);  // binds the state to the allreduce
    EXPECT_THROW(reduce_scatter(call_options<ReduceScatterOptions>(t, store, ws, *codec, state, buf)),
                 InvalidArgument);  // local: no agreement
    o.algorithm = Algorithm::ReduceScatter;
    EXPECT_THROW(allreduce(o), InvalidArgument);
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

TEST(ReduceScatter, SavedStateNamesItsCollective) {
  const auto errors = run_threads(2, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec("onebit");
    AllreduceWorkspace ws;
    ErrorFeedback state;
    auto buf = make_input(r, 256);
    reduce_scatter(call_options<ReduceScatterOptions>(t, store, ws, *codec, state, buf));
    ASSERT_TRUE(state.layout().has_value());
    EXPECT_EQ(state.layout()->algorithm, Algorithm::ReduceScatter);
    EXPECT_EQ(state.layout()->worker_count, 256u);
    EXPECT_EQ(state.layout()->server_count, 0u);
    ErrorFeedback copy;
    copy.restore(state.save());
    EXPECT_EQ(copy.layout(), state.layout());
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
}

}  // namespace
}  // namespace gz::test

// Wire bytes against payload bytes (issue 23): what a rank sends in one call
// (AllreduceStats::wire_bytes) is within 5% of the payloads its algorithm
// must move, for every codec, algorithm and both kinds of transport (exact
// sizes, as UCX; slot sizes, as NCCL and torch's process group), on buffers
// of >= 64K elements whose last pipeline segment is short. Before the fix a
// transport without exact sizes sent every segment as a whole slot: 1.28x
// for scatter_reduce at 3 ranks and 462k elements.
//
// The payloads an algorithm must move are counted here from the codec alone
// (one payload per chunk or buffer, not segmented): allgather sends its
// payload of the whole buffer to P-1 ranks; scatter_reduce sends each other
// rank's chunk (cut on the codec's blocks) to it, then its own chunk's sum
// (server codec) to P-1 ranks; reduce_scatter the first half only (chunks
// of elements). A fixed-size codec's payload crosses as its body alone (its
// header is the call's agreement: the receiver writes it); top-k's with its
// header.
//
// Issue 22's bound (TwoPhaseBound): the recommended 1-bit method
// (CompressedAdamW: onebit, server onebit, scatter_reduce) sends at most
// 2(P-1)/P payloads of the whole buffer per rank. On main (one 32-byte
// header per chunk payload, chunks split mid-block) it sent 1.004, 1.009 and
// 1.019 of that at 4, 8 and 16 ranks on 209,664 elements.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/engine/allreduce.h"
#include "comm/engine/reduce_scatter.h"
#include "compressors/descriptor.h"
#include "compressors/wire_format.h"
#include "tests/comm/collective_call.h"
#include "tests/comm/reference.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {
namespace {

// Payload bytes of `count` elements of `c` on the wire: raw floats for a
// lossless codec on the host (what moves then), the body of a fixed-size
// codec's payload, else the whole payload.
double payload(const Codec& c, std::size_t count) {
  if (count == 0) return 0;
  if (c.descriptor().lossless) return 4.0 * static_cast<double>(count);
  return static_cast<double>(c.max_payload_bytes(count) - (c.fixed_size() ? wire::kHeaderBytes : 0));
}

double needed_bytes(const std::string& spec, Algorithm a, std::size_t n, int P, int me) {
  auto c = make_codec(spec);
  auto s = make_codec(server_codec_config(c->config()));
  if (a == Algorithm::Allgather) return (P - 1) * payload(*c, n);
  if (a == Algorithm::Ring) {  // every chunk but me+1's partial sum, every chunk but me+2's sum (server codec)
    const std::size_t grain = chunk_grain(c->config(), n, P);
    double bytes = 0;
    for (int j = 0; j < P; ++j) {
      if (j != (me + 1) % P) bytes += payload(*c, chunk_range(n, P, j, grain).count);
      if (j != (me + 2) % P) bytes += payload(*s, chunk_range(n, P, j, grain).count);
    }
    return bytes;
  }
  const std::size_t grain = a == Algorithm::ScatterReduce ? chunk_grain(c->config(), n, P) : 1;
  double bytes = 0;
  for (int j = 0; j < P; ++j)
    if (j != me) bytes += payload(*c, chunk_range(n, P, j, grain).count);
  if (a == Algorithm::ScatterReduce) bytes += (P - 1) * payload(*s, chunk_range(n, P, me, grain).count);
  return bytes;
}

// Every rank's stats of one call of `a` (allreduce, or reduce_scatter);
// `server`: scatter_reduce's server codec (else the default).
std::vector<AllreduceStats> run_call_stats(int P, std::size_t n, const std::string& spec, Algorithm a, Sizes sizes,
                                           const char* server = nullptr) {
  std::vector<AllreduceStats> stats(static_cast<std::size_t>(P));
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    ErrorFeedback state;
    auto buf = make_input(r, n, 0);
    if (a == Algorithm::ReduceScatter) {
      auto o = call_options<ReduceScatterOptions>(t, store, ws, *codec, state, buf);
      o.stats = &stats[static_cast<std::size_t>(r)];
      reduce_scatter(o);
    } else {
      auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
      o.algorithm = a;
      if (server) o.server_codec = parse_spec(server);
      o.stats = &stats[static_cast<std::size_t>(r)];
      allreduce(o);
    }
  }, sizes);
  for (int r = 0; r < P; ++r)
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], nullptr) << "rank " << r << ": " << what(errors[static_cast<std::size_t>(r)]);
  return stats;
}

class WireBytes : public ::testing::TestWithParam<Sizes> {};

// Each codec's benchmark spec (the sampled top-k too: its bound is what a
// slot transport must send), at sizes whose last segment is short.
TEST_P(WireBytes, WithinFivePercentOfThePayloads) {
  struct Case {
    int P;
    std::size_t n;
    Algorithm a;
  };
  const Case cases[] = {
      {4, 262912, Algorithm::Allgather},      {3, 462000, Algorithm::ScatterReduce},
      {2, 70001, Algorithm::Allgather},       {3, 70001, Algorithm::ScatterReduce},
      {4, 462000, Algorithm::ReduceScatter},  {4, 600000, Algorithm::ScatterReduce},
      {3, 462000, Algorithm::Ring},           {4, 70001, Algorithm::Ring},
  };
  for (const CodecDescriptor* d : all_codecs())
    for (const BenchSpec& b : d->bench_specs)
    for (const Case& c : cases) {
      const std::string spec(b.spec);
      const auto stats = run_call_stats(c.P, c.n, spec, c.a, GetParam());
      for (int r = 0; r < c.P; ++r) {
        const double need = needed_bytes(spec, c.a, c.n, c.P, r);
        const double sent = static_cast<double>(stats[static_cast<std::size_t>(r)].wire_bytes);
        // The descriptor's formula (what cost models read) is this count.
        CostQuery q;
        q.codec = parse_spec(spec);
        q.server = server_codec_config(q.codec);
        q.n = c.n;
        q.rank = r;
        const Topology flat = Topology::flat(c.P);
        q.topology = &flat;
        const WireCost cost = algorithm_descriptor(c.a).wire_cost(q);
        EXPECT_NEAR(cost.bytes, need, 1e-6 * need) << spec << " " << to_string(c.a);
        EXPECT_EQ(cost.remote_bytes, cost.bytes);  // a flat topology: every rank a node
        EXPECT_EQ(cost.rounds, c.a == Algorithm::Ring ? 2 * (c.P - 1) : c.a == Algorithm::ScatterReduce ? 2 : 1);
        EXPECT_LE(sent, 1.05 * need) << spec << " " << to_string(c.a) << " P=" << c.P << " n=" << c.n << " rank " << r;
        if (payload_size_fixed(parse_spec(spec))) {
          EXPECT_GE(sent, need) << spec << " " << to_string(c.a) << " P=" << c.P << " n=" << c.n << " rank " << r;
        }
      }
    }
}

// Issue 22's bound: CompressedAdamW's exchange (onebit, server onebit,
// scatter_reduce) on the LM's 209,664 parameters, and on a buffer that is
// not a whole number of blocks or of chunks, sends per rank (the mean over
// the ranks: what the ranks send together, over P) at most 2(P-1)/P
// payloads of the whole buffer, on both kinds of transport. One rank may
// send more than that: its chunk is a block longer than another's, and it
// sends that chunk's sum to P-1 ranks (the most a rank sends is held within
// one such block per peer); the formula (wire_cost) is what each sends.
// (A buffer under 16 blocks per rank is cut on elements, as before: there
// the bound is missed by a header's worth of partial blocks.)
TEST_P(WireBytes, TwoPhaseOnebitWithinTheBoundOfTwoPayloads) {
  for (const std::size_t n : {std::size_t{209664}, std::size_t{1000003}})
    for (const int P : {4, 8, 16}) {
      const auto stats = run_call_stats(P, n, "onebit", Algorithm::ScatterReduce, GetParam(), "onebit");
      const auto codec = make_codec("onebit");
      const double bound = 2.0 * (P - 1) / P * static_cast<double>(codec->max_payload_bytes(n));
      const double block = 8.0 + 4.0 * 512 / 32;  // one block's scales and sign words
      double total = 0, most = 0;
      for (int r = 0; r < P; ++r) {
        const double sent = static_cast<double>(stats[static_cast<std::size_t>(r)].wire_bytes);
        total += sent;
        most = std::max(most, sent);
        CostQuery q;
        q.codec = parse_spec("onebit");
        q.server = q.codec;
        q.n = n;
        q.rank = r;
        const Topology flat = Topology::flat(P);
        q.topology = &flat;
        EXPECT_EQ(sent, algorithm_descriptor(Algorithm::ScatterReduce).wire_cost(q).bytes) << "P=" << P << " rank " << r;
        EXPECT_LE(sent, bound + (P - 1) * block) << "P=" << P << " n=" << n << " rank " << r;
      }
      const double mean = total / P;
      EXPECT_LE(mean, bound) << "P=" << P << " n=" << n << ": " << mean / bound << " x 2(P-1)/P payloads";
      std::printf("onebit/onebit scatter_reduce n=%zu P=%d: %.1f B/rank (mean), bound %.1f, ratio %.4f (most %.0f: %.4f)\n",
                  n, P, mean, bound, mean / bound, most, most / bound);
    }
}

// A rank whose messages are `delta` bytes off (a hostile or broken peer):
// its payloads' bodies arrive short or long.
class OffBy : public Transport {
 public:
  OffBy(Transport& inner, long delta) : inner_(inner), delta_(delta) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* name() const override { return "off-by"; }
  Exchange start(std::span<const SendOp> sends, std::span<const RecvOp> recvs, const CallContext& ctx) override {
    std::vector<SendOp> off(sends.begin(), sends.end());
    for (SendOp& s : off)
      if (s.data.bytes >= 64) s.data.bytes = static_cast<std::size_t>(static_cast<long>(s.data.bytes) + delta_);
    return inner_.start(off, recvs, ctx);
  }
  bool test(Exchange x) override { return inner_.test(x); }
  void wait(Exchange x) override { inner_.wait(x); }
  void abort(std::string_view why) override { inner_.abort(why); }
  bool exact_sizes() const override { return inner_.exact_sizes(); }
  bool device_memory() const override { return false; }

 private:
  Transport& inner_;
  long delta_;
};

// A bare body travels without the header that would say its size; the
// receiver's expected header does, and a body shorter than that is a
// PayloadError that says so ("truncated"), from either algorithm; a longer
// one is "trailing bytes", or, past the slot, the transport's refusal of a
// message longer than its receive. Every rank that receives from the
// broken one fails (allgather's broken rank itself decodes good payloads).
TEST(BareBodies, AWrongSizedBodyIsAClearError) {
  for (const Algorithm a : {Algorithm::ScatterReduce, Algorithm::Allgather})
    for (const long delta : {-4L, 4L}) {
      const int P = 3;
      const std::size_t n = 70001;
      const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
        OffBy off(t, r == 1 ? delta : 0);
        auto codec = make_codec("onebit");
        AllreduceWorkspace ws;
        ErrorFeedback state;
        auto buf = make_input(r, n, 0);
        auto o = call_options<AllreduceOptions>(off, store, ws, *codec, state, buf);
        o.algorithm = a;
        o.server_codec = parse_spec("onebit");
        o.timeout = Timeout(5000);
        allreduce(o);
      });
      int payload_errors = 0;
      for (int r = 0; r < P; ++r) {
        const std::exception_ptr& e = errors[static_cast<std::size_t>(r)];
        if (r != 1) {
          EXPECT_NE(e, nullptr) << to_string(a) << " delta " << delta << ": rank " << r << " finished";
        }
        try {
          if (e) std::rethrow_exception(e);
        } catch (const PayloadError& p) {
          ++payload_errors;
          EXPECT_NE(std::string(p.what()).find(delta < 0 ? "(truncated)" : "(trailing bytes)"), std::string::npos)
              << p.what();
        } catch (...) {
        }
      }
      if (delta < 0) {
        EXPECT_GE(payload_errors, 1) << to_string(a) << ": " << what(errors[0]);
      } else {
        bool said = false;
        for (const auto& e : errors)
          said = said || what(e).find("trailing bytes") != std::string::npos || what(e).find("truncated") != std::string::npos;
        EXPECT_TRUE(said) << to_string(a) << ": " << what(errors[0]);
      }
    }
}

// The registry: every algorithm but Auto has one descriptor, whose name is
// its spelling everywhere, and whose residual layout is the state's.
TEST(AlgorithmRegistry, NamesIdsAndResidualsAgree) {
  std::vector<Algorithm> seen;
  int position = 0;
  for (const AlgorithmDescriptor* d : all_algorithms()) {
    // The registry line makes the enumerator: its position is the number saved states hold.
    EXPECT_EQ(static_cast<int>(d->id), ++position) << d->name;
    EXPECT_TRUE(d->state_version == 1 || d->state_version == 2) << d->name;
    if (d->auto_candidate) {  // auto may pick it: an allreduce that it can rank
      EXPECT_TRUE(d->allreduce) << d->name;
      EXPECT_TRUE(d->auto_bytes || d->auto_priority > 0) << d->name;
    }
    if (d->memory_bytes) {
      EXPECT_NE(d->bytes_per_peer, nullptr) << d->name;  // memory_limit needs both
    }
    if (d->allreduce) {
      EXPECT_EQ(parse_algorithm(d->name), d->id) << d->name;
    }
    EXPECT_EQ(std::string_view(to_string(d->id)), d->name);
    EXPECT_EQ(find_algorithm(d->name), d);
    EXPECT_EQ(find_algorithm(d->id), d);
    ASSERT_NE(d->run, nullptr);
    ASSERT_NE(d->wire_cost, nullptr);
    ASSERT_NE(d->residual_counts, nullptr);
    EXPECT_FALSE(d->summary.empty());
    seen.push_back(d->id);
  }
  for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce, Algorithm::Hierarchical, Algorithm::ReduceScatter})
    EXPECT_NE(std::find(seen.begin(), seen.end(), a), seen.end()) << to_string(a);
  EXPECT_EQ(find_algorithm(Algorithm::Auto), nullptr);
  EXPECT_EQ(allreduce_algorithm_names(),
            (std::vector<std::string>{"auto", "allgather", "scatter_reduce", "hierarchical", "ring"}));
  EXPECT_THROW(parse_algorithm("reduce_scatter"), InvalidArgument);
  EXPECT_THROW(algorithm_descriptor(Algorithm::Auto), InvalidArgument);
  const auto onebit = parse_spec("onebit");
  // scatter_reduce's chunks: whole 512-element blocks once there are at
  // least 16 per rank (25,576 elements: 50 blocks, the last short, over 3
  // ranks: 17, 17, 16); below that, elements (1000: 334, 333, 333).
  EXPECT_EQ(ErrorFeedback::residual_counts(onebit, 1000, 1, 3, Algorithm::ScatterReduce, nullptr),
            (std::pair<std::uint64_t, std::uint64_t>{1000, 333}));
  EXPECT_EQ(ErrorFeedback::residual_counts(onebit, 25576, 1, 3, Algorithm::ScatterReduce, nullptr),
            (std::pair<std::uint64_t, std::uint64_t>{25576, 8704}));
  EXPECT_EQ(ErrorFeedback::residual_counts(onebit, 25576, 2, 3, Algorithm::ScatterReduce, nullptr),
            (std::pair<std::uint64_t, std::uint64_t>{25576, 8168}));
  EXPECT_EQ(ErrorFeedback::residual_counts(parse_spec("fp16"), 25576, 1, 3, Algorithm::ScatterReduce, nullptr),
            (std::pair<std::uint64_t, std::uint64_t>{25576, 8525}));
  EXPECT_EQ(ErrorFeedback::residual_counts(onebit, 1000, 1, 3, Algorithm::Allgather, nullptr),
            (std::pair<std::uint64_t, std::uint64_t>{1000, 0}));
  const Topology two_by_two = Topology::blocks(4, 2);
  EXPECT_EQ(ErrorFeedback::residual_counts(onebit, 1000, 3, 4, Algorithm::Hierarchical, &two_by_two),
            (std::pair<std::uint64_t, std::uint64_t>{500, 0}));
}

// Hierarchical on 2 nodes x 2 ranks: the formula's remote part is what
// crossed to the other node (the shard's payloads, allgather across 2).
TEST(AlgorithmRegistry, HierarchicalCostCountsWhatCrossesNodes) {
  const Topology topo = Topology::blocks(4, 2);
  const std::size_t n = 262912;
  for (const Sizes sizes : {Sizes::Exact, Sizes::Slot})
  for (const std::string spec : {"onebit", "fp16", "none", "topk:density=0.01,select=sample"}) {
    std::vector<AllreduceStats> stats(4);
    const auto errors = run_threads(4, [&](int r, Transport& t, Store& store) {
      auto codec = make_codec(spec);
      AllreduceWorkspace ws;
      ErrorFeedback state;
      auto buf = make_input(r, n, 0);
      auto o = call_options<AllreduceOptions>(t, store, ws, *codec, state, buf);
      o.algorithm = Algorithm::Hierarchical;
      o.topology = &topo;
      o.stats = &stats[static_cast<std::size_t>(r)];
      allreduce(o);
    }, sizes);
    for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
    for (int r = 0; r < 4; ++r) {
      CostQuery q;
      q.codec = parse_spec(spec);
      q.server = server_codec_config(q.codec);
      q.n = n;
      q.rank = r;
      q.topology = &topo;
      const WireCost cost = algorithm_descriptor(Algorithm::Hierarchical).wire_cost(q);
      const auto& s = stats[static_cast<std::size_t>(r)];
      EXPECT_LE(static_cast<double>(s.remote_bytes), 1.05 * cost.remote_bytes) << spec << " rank " << r;
      if (payload_size_fixed(q.codec)) {
        EXPECT_GE(static_cast<double>(s.remote_bytes), cost.remote_bytes) << spec << " rank " << r;
      }
      EXPECT_LE(static_cast<double>(s.wire_bytes), 1.05 * cost.bytes) << spec << " rank " << r;
      EXPECT_EQ(cost.rounds, 3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, WireBytes, ::testing::Values(Sizes::Exact, Sizes::Slot),
                         [](const ::testing::TestParamInfo<Sizes>& which) { return which.param == Sizes::Exact ? "ExactSizes" : "SlotSizes"; });

}  // namespace
}  // namespace gz::test

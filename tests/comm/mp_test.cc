// Real multi-process runs: each rank a process, the Store a TcpStore hosted
// by rank 0, the transport UCX over loopback / shared memory
// (Communicator::from_env, exactly what users and the Python bindings call).
// The calls are pipelined: several segments, hence several exchanges, are in
// flight at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <future>
#include <map>
#include <thread>

#include "comm/engine/communicator.h"
#include "common/error.h"
#include "tests/comm/exchange_check.h"
#include "tests/comm/multiprocess.h"
#include "tests/comm/reference.h"

namespace gz::test {
namespace {

AllreduceCall with(Algorithm a, ReduceOp op = ReduceOp::Sum) {
  AllreduceCall c;
  c.algorithm = a;
  c.op = op;
  return c;
}

MpOptions opts(int timeout_s = 20, int limit_s = 90) {
  MpOptions o;
  o.limit = std::chrono::seconds(limit_s);
  o.env["GRADZIP_TIMEOUT_S"] = std::to_string(timeout_s);
  return o;
}

void expect_all_ok(const std::vector<RankOutcome>& res) {
  for (const auto& o : res)
    EXPECT_TRUE(o.exit_code == kOk && !o.signal) << "rank " << o.rank << " failed:\n" << describe(res);
}

class Mp : public ::testing::TestWithParam<int> {};

// none over UCX equals the exact sum bit for bit (integer-valued inputs), for
// both algorithms and uneven sizes (n % P != 0, n < P, n = 1, n = 0), and
// average is that times 1/P.
// The harness forks the ranks; a thread running beside it at the fork could
// hold a lock the child then waits on forever (UCX's memory hooks did: a rank
// hung in ucp_init). It refuses instead of hanging one run in a few.
TEST(MpHarness, RefusesToForkBesideARunningThread) {
  std::promise<void> release;
  std::thread beside([done = release.get_future()]() mutable { done.wait(); });
  try {
    run_ranks(1, [](int) { return kOk; });
    ADD_FAILURE() << "run_ranks forked while another thread ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("2 threads"), std::string::npos) << e.what();
  }
  release.set_value();
  beside.join();
  const auto res = run_ranks(1, [](int) { return kOk; });  // alone again: it forks
  EXPECT_EQ(res[0].exit_code, kOk) << describe(res);
}

TEST_P(Mp, NoneIsExactForEveryAlgorithmAndSize) {
  const int P = GetParam();
  const auto res = run_ranks(P, [P](int rank) {
    auto comm = Communicator::from_env("ucx");
    auto codec = make_codec("none");
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(P - 1), std::size_t{1001}, std::size_t{300007}})
      for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
          ErrorFeedback state;
          auto buf = make_input(rank, n, 0, true);
          comm->allreduce(buf.data(), n, *codec, state, with(a, op));
          const auto exact = exact_sum(P, n, 0, true);
          const float scale = op == ReduceOp::Sum ? 1.0f : 1.0f / static_cast<float>(P);
          for (std::size_t i = 0; i < n; ++i) MP_CHECK(buf[i] == static_cast<float>(exact[i]) * scale);
        }
    return kOk;
  }, opts());
  expect_all_ok(res);
}

// Every codec, both algorithms: within the documented error, and the same
// bits on every rank (each rank prints a fingerprint; the parent compares).
TEST_P(Mp, CodecsAreWithinBoundAndIdenticalOnAllRanks) {
  const int P = GetParam();
  const std::vector<std::string> specs = {"fp16", "bf16", "onebit", "topk:density=0.01",
                                          "topk:density=0.05,select=sample"};
  const auto res = run_ranks(P, [&](int rank) {
    auto comm = Communicator::from_env("ucx");
    for (const auto& spec : specs)
      for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce})
        for (std::size_t n : {std::size_t{5}, std::size_t{40009}}) {
          auto codec = make_codec(spec);
          ErrorFeedback state;
          auto buf = make_input(rank, n);
          comm->allreduce(buf.data(), n, *codec, state, with(a));
          const double err = rel_error(buf, exact_sum(P, n));
          if (n > 100) MP_CHECK(err <= allreduce_error_bound(codec->config()));
          std::printf("FP %s %s %zu %016" PRIx64 " err=%.3g\n", spec.c_str(), to_string(a), n,
                      fingerprint(buf.data(), n), err);
        }
    return kOk;
  }, opts());
  expect_all_ok(res);
  const auto fp0 = tagged_lines(res[0], "FP ");
  EXPECT_EQ(fp0.size(), specs.size() * 4);
  for (int r = 1; r < P; ++r) {
    // Same codec, algorithm, n and bits; the error column is the same too.
    EXPECT_EQ(tagged_lines(res[static_cast<std::size_t>(r)], "FP "), fp0) << "rank " << r << " differs:\n" << describe(res);
  }
}

// Error feedback over many steps: the running sum of the results tracks the
// true running sum.
TEST_P(Mp, ErrorFeedbackConvergesToTheRunningSum) {
  const int P = GetParam();
  const auto res = run_ranks(P, [P](int rank) {
    auto comm = Communicator::from_env("ucx");
    const std::size_t n = 1500;
    const int steps = 200;
    for (const char* spec : {"topk:density=0.01", "onebit"}) {
      auto codec = make_codec(spec);
      ErrorFeedback state;
      std::vector<double> got(n), want(n);
      for (int s = 0; s < steps; ++s) {
        auto buf = make_input(rank, n, s);
        comm->allreduce(buf.data(), n, *codec, state);
        const auto ex = exact_sum(P, n, s);
        for (std::size_t i = 0; i < n; ++i) {
          got[i] += buf[i];
          want[i] += ex[i];
        }
      }
      const double err = rel_error(got, want);
      std::printf("EF %s running-sum error %.4f\n", spec, err);
      MP_CHECK(err < 0.3);
    }
    return kOk;
  }, opts());
  expect_all_ok(res);
}

// One rank calls with another codec and n: every rank fails, naming it.
TEST_P(Mp, MismatchFailsOnEveryRankNamingTheRank) {
  const int P = GetParam();
  const int odd = P - 1;
  const auto res = run_ranks(P, [odd](int rank) {
    auto comm = Communicator::from_env("ucx");
    auto codec = make_codec(rank == odd ? "fp16" : "onebit");
    ErrorFeedback state;
    std::vector<float> buf(rank == odd ? 77 : 100, 1.0f);
    comm->allreduce(buf.data(), buf.size(), *codec, state);
    return kOk;
  }, opts());
  const std::string who = "rank " + std::to_string(odd) + " 'fp16'";
  const std::string n = "rank " + std::to_string(odd) + " '77'";
  for (const auto& o : res) {
    EXPECT_EQ(o.exit_code, kInvalidArgument) << describe(res);
    EXPECT_NE(o.output.find(who), std::string::npos) << describe(res);
    EXPECT_NE(o.output.find(n), std::string::npos) << describe(res);
  }
}

// The transport contract over UCX: exchanges in flight together, matched per
// pair in posting order, waited in any order.
TEST_P(Mp, ExchangesMatchPerPairInPostingOrder) {
  const int P = GetParam();
  const auto res = run_ranks(P, [](int) {
    auto comm = Communicator::from_env("ucx");
    const std::string broke = check_exchanges(comm->transport(), comm->timeout());
    if (!broke.empty()) std::fprintf(stderr, "%s\n", broke.c_str());
    MP_CHECK(broke.empty());
    return kOk;
  }, opts());
  expect_all_ok(res);
}

// Pipelining over UCX: any segment size, the bits of the unsegmented call
// (codecs whose payloads do not depend on segment starts), on every rank.
TEST_P(Mp, SegmentedCallsGiveTheUnsegmentedBits) {
  const int P = GetParam();
  const auto res = run_ranks(P, [](int rank) {
    auto comm = Communicator::from_env("ucx");
    const std::size_t n = 300007;
    for (const char* spec : {"none", "fp16", "onebit"})
      for (Algorithm a : {Algorithm::Allgather, Algorithm::ScatterReduce})
        for (std::size_t segment : {std::size_t{1} << 40, std::size_t{1}, std::size_t{20000}}) {
          auto codec = make_codec(spec);
          ErrorFeedback state;
          std::vector<float> buf;
          AllreduceCall call = with(a, ReduceOp::Average);
          call.segment_bytes = segment;
          AllreduceStats stats;
          call.stats = &stats;
          for (int step = 0; step < 2; ++step) {
            buf = make_input(rank, n, step);
            comm->allreduce(buf.data(), n, *codec, state, call);
          }
          if (segment == 1) MP_CHECK(stats.segments > 10);
          std::printf("FP %s %s %016" PRIx64 "\n", spec, to_string(a), fingerprint(buf.data(), n));
        }
    return kOk;
  }, opts());
  expect_all_ok(res);
  const auto fp0 = tagged_lines(res[0], "FP ");
  ASSERT_EQ(fp0.size(), 18u);
  for (std::size_t i = 0; i < fp0.size(); i += 3) {  // three segment sizes per (codec, algorithm)
    EXPECT_EQ(fp0[i + 1], fp0[i]) << describe(res);
    EXPECT_EQ(fp0[i + 2], fp0[i]) << describe(res);
  }
  for (int r = 1; r < P; ++r) EXPECT_EQ(tagged_lines(res[static_cast<std::size_t>(r)], "FP "), fp0) << describe(res);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Mp, ::testing::Values(2, 3, 4), ::testing::PrintToStringParamName());

// Two nodes of two ranks, named by GRADZIP_NODE as gradzip-run
// --ranks-per-node does: the ranks find the layout, auto runs hierarchical,
// none stays exact and onebit is identical on every rank.
TEST(MpHierarchical, NodesFoundAndTheResultExact) {
  MpOptions o = opts();
  o.env["LOCAL_WORLD_SIZE"] = "2";
  const auto res = run_ranks(4, [](int rank) {
    ::setenv("GRADZIP_NODE", std::to_string(rank / 2).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
    auto comm = Communicator::from_env("ucx");
    MP_CHECK(comm->topology().describe() == "4 ranks: 2 nodes x 2");
    const std::size_t n = 100003;
    {
      auto codec = make_codec("none");
      ErrorFeedback state;
      auto buf = make_input(rank, n, 0, true);
      AllreduceStats stats;
      AllreduceCall call;
      call.stats = &stats;
      call.segment_bytes = 8192;
      comm->allreduce(buf.data(), n, *codec, state, call);
      MP_CHECK(stats.algorithm == Algorithm::Hierarchical);
      const auto exact = exact_sum(4, n, 0, true);
      for (std::size_t i = 0; i < n; ++i) MP_CHECK(buf[i] == static_cast<float>(exact[i]));
    }
    auto codec = make_codec("onebit");
    ErrorFeedback state;
    auto buf = make_input(rank, n);
    comm->allreduce(buf.data(), n, *codec, state);
    MP_CHECK(rel_error(buf, exact_sum(4, n)) <= allreduce_error_bound(codec->config()));
    std::printf("FP %016" PRIx64 "\n", fingerprint(buf.data(), n));
    return kOk;
  }, o);
  expect_all_ok(res);
  for (int r = 1; r < 4; ++r)
    EXPECT_EQ(tagged_lines(res[static_cast<std::size_t>(r)], "FP "), tagged_lines(res[0], "FP ")) << describe(res);
}

// A launcher that says 2 ranks per node while the names put 3 on one node:
// every rank refuses, naming both.
TEST(MpHierarchical, ContradictoryLocalSizeIsRefused) {
  MpOptions o = opts();
  o.env["LOCAL_WORLD_SIZE"] = "2";
  const auto res = run_ranks(3, [](int) {
    ::setenv("GRADZIP_NODE", "same", 1);
    auto comm = Communicator::from_env("ucx");
    return kOk;
  }, o);
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, kInvalidArgument) << describe(res);
    EXPECT_NE(r.output.find("rank 1: LOCAL_WORLD_SIZE=2 but 3 rank(s) share its node"), std::string::npos)
        << describe(res);
  }
}

// The last rank dies (SIGKILL) while the others are inside allreduce calls
// (pipelined: several exchanges in flight): they fail with IoError within the
// timeout, never hang. `nodes` > 0 names that many nodes (GRADZIP_NODE) and
// runs the hierarchical algorithm. Returns how long after the death each
// survivor failed.
struct KillCase {
  int ranks = 3;
  const char* codec = "none";
  std::size_t segment_bytes = 0;
  int per_node = 0;  // > 0: ranks per node, hierarchical
};

std::vector<double> kill_one_rank(const std::map<std::string, std::string>& env, KillCase c = {}) {
  const int P = c.ranks, timeout_s = 5;
  MpOptions mo = opts(timeout_s, 60);
  for (const auto& [k, v] : env) mo.env[k] = v;
  if (c.per_node) mo.env["LOCAL_WORLD_SIZE"] = std::to_string(c.per_node);
  const auto res = run_ranks(P, [P, c](int rank) {
    if (c.per_node) ::setenv("GRADZIP_NODE", std::to_string(rank / c.per_node).c_str(), 1);
    auto comm = Communicator::from_env("ucx");
    auto codec = make_codec(c.codec);
    ErrorFeedback state;
    const std::size_t n = 1 << 20;
    std::vector<float> buf(n, 1.0f);
    AllreduceCall call;
    call.segment_bytes = c.segment_bytes;
    call.algorithm = c.per_node ? Algorithm::Hierarchical : Algorithm::Auto;
    AllreduceStats stats;
    call.stats = &stats;
    comm->allreduce(buf.data(), n, *codec, state, call);  // all alive: works
    MP_CHECK(stats.segments > 1);
    if (rank == P - 1) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        ::raise(SIGKILL);
      }).detach();
    }
    for (int i = 0; i < 100000; ++i) comm->allreduce(buf.data(), n, *codec, state, call);
    return kOk;
  }, mo);
  const double died = res[P - 1].seconds;
  std::vector<double> after;
  EXPECT_EQ(res[P - 1].signal, SIGKILL) << describe(res);
  for (int r = 0; r < P - 1; ++r) {
    const auto& o = res[static_cast<std::size_t>(r)];
    EXPECT_EQ(o.exit_code, kIoError) << describe(res);
    EXPECT_LT(o.seconds - died, timeout_s + 2.0) << "rank " << r << " took too long to notice:\n" << describe(res);
    EXPECT_NE(o.output.find("IoError"), std::string::npos) << describe(res);
    std::printf("rank %d failed %.2f s after rank %d died\n", r, o.seconds - died, P - 1);
    after.push_back(o.seconds - died);
  }
  return after;
}

// Shared memory (the local default): UCX's shm transports report no peer
// failure, so the wait deadline ends the wait.
TEST(MpFailure, KilledRankMakesTheOthersFailWithinTheTimeout) { kill_one_rank({}); }

// UCX_TLS=tcp (as in the emulated cluster): endpoints use the peer error
// mode, so the error handler reports the death long before the timeout.
TEST(MpFailure, KilledRankOverTcpIsReportedByTheErrorHandler) {
  for (double s : kill_one_rank({{"UCX_TLS", "tcp,self"}})) EXPECT_LT(s, 2.0);
}

// Mid-pipeline: onebit in 16 KiB segments, many exchanges in flight.
TEST(MpFailure, KilledRankDuringAPipelinedCall) {
  kill_one_rank({{"UCX_TLS", "tcp,self"}}, KillCase{3, "onebit", 16384, 0});
  kill_one_rank({}, KillCase{4, "fp16", 65536, 0});
}

// Mid-hierarchical: two nodes of two ranks; the killed rank's node partner
// and the other node both notice.
TEST(MpFailure, KilledRankDuringAHierarchicalCall) {
  kill_one_rank({{"UCX_TLS", "tcp,self"}}, KillCase{4, "onebit", 65536, 2});
}

// The last rank stops answering (SIGSTOP: alive, silent): the others time out
// with IoError naming the rank they waited for, within the timeout.
TEST(MpFailure, SilentRankMakesTheOthersTimeOut) {
  const int P = 3, timeout_s = 3;
  const auto res = run_ranks(P, [P](int rank) {
    auto comm = Communicator::from_env("ucx");
    auto codec = make_codec("onebit");
    ErrorFeedback state;
    std::vector<float> buf(1000, 1.0f);
    comm->allreduce(buf.data(), buf.size(), *codec, state);
    if (rank == P - 1) {
      std::printf("stopping\n");
      std::fflush(stdout);
      ::raise(SIGSTOP);  // the parent's time limit ends it
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm->allreduce(buf.data(), buf.size(), *codec, state);
    } catch (const IoError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("WAITED %.2f\n", s);
      throw;
    }
    return kOk;
  }, opts(timeout_s, timeout_s + 5));
  for (int r = 0; r < P - 1; ++r) {
    const auto& o = res[static_cast<std::size_t>(r)];
    EXPECT_EQ(o.exit_code, kIoError) << describe(res);
    EXPECT_NE(o.output.find("timed out"), std::string::npos) << describe(res);
    EXPECT_NE(o.output.find(std::to_string(P - 1)), std::string::npos) << describe(res);
    const auto waited = tagged_lines(o, "WAITED ");
    ASSERT_EQ(waited.size(), 1u) << describe(res);
    EXPECT_GE(std::stod(waited[0]), timeout_s - 0.5);
    EXPECT_LT(std::stod(waited[0]), timeout_s + 2.0);
  }
  EXPECT_TRUE(res[P - 1].timed_out) << describe(res);
}

// Checkpointing across processes: save, rebuild, restore, continue: the same
// bits as a run that never stopped.
TEST(MpState, SaveRestoreContinuesBitIdentically) {
  const int P = 3;
  const auto res = run_ranks(P, [](int rank) {
    auto comm = Communicator::from_env("ucx");
    auto codec = make_codec("onebit");
    const std::size_t n = 10007;
    std::uint64_t fp[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      auto state = std::make_unique<ErrorFeedback>();
      std::vector<float> buf;
      for (int s = 0; s < 8; ++s) {
        if (mode == 1 && s == 4) {
          const std::string saved = state->save();
          state = std::make_unique<ErrorFeedback>();
          state->restore(saved);
        }
        buf = make_input(rank, n, s);
        comm->allreduce(buf.data(), n, *codec, *state, with(Algorithm::ScatterReduce));
      }
      fp[mode] = fingerprint(buf.data(), n);
    }
    MP_CHECK(fp[0] == fp[1]);
    return kOk;
  }, opts());
  expect_all_ok(res);
}

}  // namespace
}  // namespace gz::test

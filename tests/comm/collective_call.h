// Test pieces the collectives' thread tests share (allreduce_thread_test.cc,
// reduce_scatter_thread_test.cc): a call's options with the parts every test
// sets, a checkpoint of a state mid-run, and the running-sum check of error
// feedback. Written once for both collectives, whose options name the same
// parts the same way.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/engine/allreduce.h"
#include "comm/engine/error_feedback.h"
#include "comm/engine/reduce_scatter.h"
#include "tests/comm/reference.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {

/// The options of a call (AllreduceOptions or ReduceScatterOptions) on the
/// whole of `buf`: the parts every test sets, and a 20 s timeout.
template <class Options>
Options call_options(Transport& t, Store& store, AllreduceWorkspace& ws, Codec& codec, ErrorFeedback& state,
                     std::vector<float>& buf) {
  Options o;
  o.transport = &t;
  o.store = &store;
  o.workspace = &ws;
  o.codec = &codec;
  o.state = &state;
  o.buffer = buf.data();
  o.n = buf.size();
  o.timeout = Timeout(20000);
  return o;
}

inline void run_call(const AllreduceOptions& o) { allreduce(o); }
inline void run_call(const ReduceScatterOptions& o) { reduce_scatter(o); }

/// The elements of rank r's buffer that hold a result worth counting once:
/// an allreduce leaves the same bits on every rank, so rank 0's whole
/// buffer; a reduce-scatter leaves every rank its own chunk.
inline ChunkRange result_range(const AllreduceOptions&, std::size_t n, int, int r) {
  return r == 0 ? ChunkRange{0, n} : ChunkRange{};
}
inline ChunkRange result_range(const ReduceScatterOptions&, std::size_t n, int P, int r) {
  return chunk_range(n, P, r);
}

/// A checkpoint mid-run: save the state, drop it, restore into a new one.
inline void checkpoint(std::unique_ptr<ErrorFeedback>& state) {
  const std::string saved = state->save();
  state = std::make_unique<ErrorFeedback>();
  state->restore(saved);
}

/// `spec` with error feedback off.
inline std::string without_ef(const std::string& spec) {
  return spec + (spec.find(':') == std::string::npos ? ":ef=off" : ",ef=off");
}

/// Error feedback's promise, measured: `steps` calls of `spec` on P threads
/// (rank r's input make_input(r, n, step), one state per rank kept across
/// the steps), `configure` setting the rest of the options. Returns the
/// relative error of the running sum of the results (result_range) against
/// the exact running sum at the end, and after `early` steps into *at_early.
/// Each rank adds only its own range, so no two ranks write one element.
template <class Options>
double running_sum_error(int P, std::size_t n, int steps, const std::string& spec,
                         const std::function<void(Options&)>& configure = {}, int early = 0,
                         double* at_early = nullptr) {
  std::vector<double> got(n), want(n), got_early(n), want_early(n);
  const auto errors = run_threads(P, [&](int r, Transport& t, Store& store) {
    auto codec = make_codec(spec);
    AllreduceWorkspace ws;
    ErrorFeedback state;
    for (int step = 0; step < steps; ++step) {
      auto buf = make_input(r, n, step);
      Options o = call_options<Options>(t, store, ws, *codec, state, buf);
      if (configure) configure(o);
      run_call(o);
      const ChunkRange mine = result_range(o, n, P, r);
      if (mine.count == 0) continue;
      const auto exact = exact_sum(P, n, step);
      for (std::size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
        got[i] += buf[i], want[i] += exact[i];
        if (step + 1 == early) got_early[i] = got[i], want_early[i] = want[i];
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, nullptr) << what(e);
  if (at_early) *at_early = rel_error(got_early, want_early);
  return rel_error(got, want);
}

}  // namespace gz::test

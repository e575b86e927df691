// The measuring part of gradzip-bench: one row = one codec at one size,
// timed over iterations, verified against the exact sum (seeded inputs, sum
// in double) and across ranks (every rank must hold the same bits).
#pragma once

#include <string>

#include "bench/allreduce/options.h"
#include "comm/engine/communicator.h"

namespace gz::bench {

struct Row {
  std::string codec;
  Algorithm algorithm = Algorithm::Auto;
  std::string transport;
  int ranks = 1;
  std::size_t elements = 0;
  std::size_t wire_bytes = 0;      ///< bytes one rank sends per call to other ranks (several nodes: other nodes)
  std::size_t local_bytes = 0;     ///< several nodes: bytes one rank sends per call within its node
  double ratio = 0;                ///< fp32 baseline wire bytes / this row's
  double encode_ms = 0, comm_ms = 0, decode_ms = 0, total_ms = 0;  ///< mean per call, max over ranks
  double wait_ms = 0;              ///< blocked on the wire: the comm not hidden (mean, max over ranks)
  double hidden = 0;               ///< share of encode + decode that ran while bytes moved (0..1)
  std::size_t segments = 0;        ///< pipeline steps per call
  double baseline_ms = 0;          ///< the uncompressed fp32 allreduce (none, scatter_reduce)
  double speedup = 0;
  double rel_error = 0;            ///< ||out - exact|| / ||exact|| of the first call (zero EF state)
  double error_bound = 0;
  std::size_t workspace_bytes = 0;   ///< payload slots + chunk sum + codec scratch
  std::size_t workspace_bound = 0;   ///< (P + 1) payloads + n/P floats (+ codec scratch)
  double predicted_ms = 0;         ///< --predict: the cost model's total (0: no model)
  double predicted_fit_ms = 0;     ///< --predict: the same with the codec work this row measured (enc + dec)
  double limit_ms = 0;             ///< --predict: max(link time, codec memory bytes / copy bandwidth)
  bool native = false;             ///< the transport's own allreduce (codec: its name), not gradzip's
  bool identical = true;           ///< every rank got the same bits
  bool ok = true;
  std::string note;
};


class Harness {
 public:
  Harness(Communicator& comm, const Options& options);
  ~Harness();

  /// Runs one row (collective: every rank calls with the same arguments).
  Row run(const std::string& spec, std::size_t n, Algorithm algorithm);
  /// The transport's own dense allreduce of n floats (Transport::native_allreduce,
  /// e.g. ncclAllReduce), for comparison; only where it has one.
  Row run_native_allreduce(std::size_t n);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace gz::bench

// gradzip-bench: the multi-rank compressed-allreduce benchmark. Run it under
// a launcher (gradzip-run, torchrun, mpirun, srun):
//   build/bin/gradzip-run -n 4 -- build/bin/gradzip-bench
// Rank 0 prints; every rank measures. Exit status 0 only when every row is OK.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/allreduce/harness.h"
#include "bench/allreduce/options.h"
#include "bench/allreduce/report.h"
#include "comm/engine/communicator.h"
#include "common/error.h"

int main(int argc, char** argv) {
  using namespace gz;
  const bench::Options o = bench::parse_options(argc, argv);
  try {
    CommunicatorOptions copt;
    copt.link = o.link;
    if (o.timeout_s > 0) copt.timeout = Timeout(static_cast<Timeout::rep>(std::ceil(o.timeout_s * 1000)));
    auto comm = Communicator::from_env(o.transport, copt);
    const bool root = comm->rank() == 0;
    const std::string desc = comm->transport().describe();
    if (o.predict) {
      // The model's shared inputs (collective): what every row's prediction uses.
      AllreduceCall call;
      call.algorithm = Algorithm::Allgather;
      call.device = o.device;
      const auto none = make_codec("none");
      const auto in = comm->cost_inputs(*none, 1 << 20, call);
      if (root && in)
        std::printf("# model: link %.3g Gbit/s x %.2f, %.0f us per exchange, burst %.0f KiB, transport %.2f ns/B, codec work %.2fx one quiet core, copy %.1f GB/s (measured)\n",
                    in->link.bits_per_s / 1e9, in->link.efficiency, in->link.latency_s * 1e6, in->link.burst_bytes / 1024,
                    in->link.transport_s_per_byte * 1e9, in->compute_share,
                    in->machine.copy_bytes_per_s / 1e9);
      else if (root)
        std::printf("# model: off (no link: give --link or run under gradzip-run --link; CUDA and 1 rank: none)\n");
    }
    if (root) bench::print_header(o, comm->size(), desc, comm->topology().describe());

    bench::Harness h(*comm, o);
    std::vector<bench::Row> rows;
    for (std::size_t n : o.sizes) {
      // The baseline first: the uncompressed fp32 allreduce on this transport.
      bench::Row base = h.run("none", n, Algorithm::ScatterReduce);
      auto finish = [&](bench::Row& r) {
        r.baseline_ms = base.total_ms;
        r.speedup = r.total_ms > 0 ? base.total_ms / r.total_ms : 0;
        r.ratio = r.wire_bytes ? static_cast<double>(base.wire_bytes) / static_cast<double>(r.wire_bytes) : 0;
        if (root) bench::print_row(r);
        if (root && !o.jsonl.empty()) bench::append_jsonl(o.jsonl, r);
        rows.push_back(r);
      };
      bool base_listed = false;
      for (const auto& spec : o.codecs) {
        const CodecConfig cfg = parse_spec(spec);
        AllreduceCall what;
        what.algorithm = o.algorithm;
        what.segment_bytes = o.segment_bytes;
        what.device = o.device;
        const bool is_base = cfg.id == CodecId::None &&
                             comm->resolve_algorithm(*make_codec(cfg), n, what) == Algorithm::ScatterReduce;
        bench::Row r = is_base ? base : h.run(spec, n, o.algorithm);
        if (r.codec == "none" && r.algorithm == Algorithm::ScatterReduce) base_listed = true;
        finish(r);
      }
      if (!base_listed) finish(base);
      if (comm->transport().native_allreduce()) {  // the transport's own allreduce, as nccl-tests' reference
        bench::Row r = h.run_native_allreduce(n);
        finish(r);
      }
    }
    bool ok = true;
    if (root) {
      ok = bench::print_footer(rows);
      if (!o.json.empty()) bench::write_json(o.json, rows);
    }
    comm->barrier();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradzip-bench: %s\n", e.what());
    return 1;
  }
}

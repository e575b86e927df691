// gradzip-kernels-bench: runs the registered benchmarks with the usual Google
// Benchmark flags, then prints each codec's rate as a share of the copy
// baseline measured in the same run, and top-k selection against
// std::nth_element, with the targets from the issues marked met or missed.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "bench_util.h"

namespace gz::bench {
namespace {

// Console output as usual, plus a copy of every run's rates for the summary.
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  struct Rates {
    double items = 0, bytes = 0, seconds = 0;
  };
  std::map<std::string, Rates> runs;

  // With --benchmark_repetitions, the median of the repetitions is used.
  void ReportRuns(const std::vector<Run>& reports) override {
    for (const Run& r : reports) {
      if (r.error_occurred) continue;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type != Run::RT_Iteration && !median) continue;
      if (!median && from_median_.count(r.run_name.str())) continue;
      if (median) from_median_.insert(r.run_name.str());
      Rates& x = runs[r.run_name.str()];
      auto get = [&](const char* key) {
        auto it = r.counters.find(key);
        return it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
      };
      x.items = get("items_per_second");
      x.bytes = get("bytes_per_second");
      x.seconds = r.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(reports);
  }

  std::set<std::string> from_median_;

  const Rates* find(const std::string& name) const {
    auto it = runs.find(name);
    return it == runs.end() ? nullptr : &it->second;
  }
};

// "% of copy" for the codecs of one family (cpu: elements/s; cuda: bytes/s).
// Dense lossy codecs are held to the targets at n = 16M.
void summarize_family(const RecordingReporter& rep, const char* enc, const char* dec, const char* copy,
                      bool by_bytes, double enc_target, double dec_target) {
  bool header = false;
  for (std::size_t n : sizes()) {
    const std::string sn = size_name(n);
    const auto* base = rep.find(std::string(copy) + "/" + sn);
    if (!base) continue;
    const double base_rate = by_bytes ? base->bytes : base->items;
    if (!header) {
      std::printf("\n# %s / %s vs %s (%s per second, same run); targets for dense lossy codecs at n = 16M: "
                  "encode >= %.0f%%, decode >= %.0f%%\n",
                  enc, dec, copy, by_bytes ? "bytes moved" : "elements", enc_target * 100, dec_target * 100);
      std::printf("# %-12s %12s %10s %10s\n", "codec", "n", "encode", "decode");
      header = true;
    }
    for (const BenchCodec& c : bench_codecs()) {
      const auto* e = rep.find(std::string(enc) + "/" + c.name + "/" + sn);
      const auto* d = rep.find(std::string(dec) + "/" + c.name + "/" + sn);
      if (!e && !d) continue;
      const double er = e ? (by_bytes ? e->bytes : e->items) / base_rate : 0;
      const double dr = d ? (by_bytes ? d->bytes : d->items) / base_rate : 0;
      const bool targeted = n == (std::size_t{16} << 20) && c.targeted();
      std::printf("  %-12s %12zu %9.0f%% %9.0f%%%s\n", c.name.c_str(), n, 100 * er, 100 * dr,
                  targeted ? (er >= enc_target && dr >= dec_target ? "  target met" : "  target MISSED") : "");
    }
  }
}

void summarize(const RecordingReporter& rep) {
  summarize_family(rep, "encode", "decode", "copy", false, 0.40, 0.60);
  summarize_family(rep, "encode_cuda", "decode_cuda", "copy_cuda", true, 0.85, 0.85);
  bool header = false;
  for (const auto& [name, rates] : rep.runs) {
    if (name.rfind("topk_select/", 0) != 0) continue;
    const auto* nth = rep.find("nth_element/" + name.substr(12));
    if (!nth) continue;
    if (!header) {
      std::printf("\n# top-k selection vs std::nth_element (same run); target >= 8x at n = 16M, k = 1%%\n");
      header = true;
    }
    const double speedup = nth->seconds / rates.seconds;
    const bool targeted = name.find("/16777216/") != std::string::npos;
    std::printf("  %-28s %7.1fx%s\n", name.c_str(), speedup, targeted ? (speedup >= 8 ? "  target met" : "  target MISSED") : "");
  }
}

}  // namespace
}  // namespace gz::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  gz::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  gz::bench::summarize(reporter);
  benchmark::Shutdown();
  return 0;
}

// gradzip-kernels-bench: runs the registered benchmarks with the usual Google
// Benchmark flags, then prints each codec's rate as a share of the copy
// baseline measured in the same run, and top-k selection against
// std::nth_element, with the targets from the issues marked met or missed.
//
// Every output flag keeps its meaning (--benchmark_format=console|json|csv,
// --benchmark_out, --benchmark_out_format, --benchmark_color, ...): the
// results go through the reporter the flags pick. The summary is text, so it
// follows a console table on stdout and goes to stderr when stdout carries
// JSON or CSV.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "bench_util.h"

namespace gz::bench {
namespace {

// Passes every report on to the reporter the flags chose and keeps a copy
// of each run's rates for the summary.
class RecordingReporter : public benchmark::BenchmarkReporter {
 public:
  struct Rates {
    double items = 0, bytes = 0, seconds = 0;
  };
  std::map<std::string, Rates> runs;

  RecordingReporter() : display_(benchmark::CreateDefaultDisplayReporter()) {}

  /// Whether the chosen output is the human-readable table (--benchmark_format=console).
  bool console() const { return dynamic_cast<const benchmark::ConsoleReporter*>(display_.get()) != nullptr; }

  bool ReportContext(const Context& context) override {
    display_->SetOutputStream(&GetOutputStream());
    display_->SetErrorStream(&GetErrorStream());
    return display_->ReportContext(context);
  }

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
    display_->ReportRuns(reports);
  }

  void Finalize() override { display_->Finalize(); }

  const Rates* find(const std::string& name) const {
    auto it = runs.find(name);
    return it == runs.end() ? nullptr : &it->second;
  }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> display_;
  std::set<std::string> from_median_;
};

// The CPU and vector ISA belong with every number: the CPU loops take a
// different path on AVX-512, AVX2 and portable builds (BENCHMARKS.md names
// them per table). Also in the context of every output format.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "unknown";
}

// What this CPU offers, of what the kernels can use.
std::string cpu_isa() {
  std::string isa = __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "SSE2";
  if (__builtin_cpu_supports("f16c")) isa += " F16C";
  return isa;
}

// What the kernels were compiled for (-march=native, or the portable baseline).
std::string build_isa() {
#if defined(__AVX512F__)
  std::string isa = "AVX-512";
#elif defined(__AVX2__)
  std::string isa = "AVX2";
#else
  std::string isa = "SSE2 (portable)";
#endif
#if defined(__F16C__)
  isa += " F16C";
#endif
  return isa;
}

std::string machine_line() {
  return "machine: " + cpu_model() + " (" + cpu_isa() + "); kernels built for " + build_isa();
}

void add_machine_context() {
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("cpu_isa", cpu_isa());
  benchmark::AddCustomContext("build_isa", build_isa());
}

// "% of copy" for the codecs of one family (cpu: elements/s; cuda: bytes/s).
// Dense lossy codecs are held to the targets at n = 16M.
void summarize_family(std::FILE* out, const RecordingReporter& rep, const char* enc, const char* dec, const char* copy,
                      bool by_bytes, double enc_target, double dec_target) {
  bool header = false;
  for (std::size_t n : sizes()) {
    const std::string sn = size_name(n);
    const auto* base = rep.find(std::string(copy) + "/" + sn);
    if (!base) continue;
    const double base_rate = by_bytes ? base->bytes : base->items;
    for (const BenchCodec& c : bench_codecs()) {
      const auto* e = rep.find(std::string(enc) + "/" + c.name + "/" + sn);
      const auto* d = rep.find(std::string(dec) + "/" + c.name + "/" + sn);
      if (!e && !d) continue;
      if (!header) {
        std::fprintf(out,
                     "\n# %s / %s vs %s (%s per second, same run); targets for dense lossy codecs at n = 16M: "
                     "encode >= %.0f%%, decode >= %.0f%%\n",
                     enc, dec, copy, by_bytes ? "bytes moved" : "elements", enc_target * 100, dec_target * 100);
        std::fprintf(out, "# %-12s %12s %10s %10s\n", "codec", "n", "encode", "decode");
        header = true;
      }
      const double er = e ? (by_bytes ? e->bytes : e->items) / base_rate : 0;
      const double dr = d ? (by_bytes ? d->bytes : d->items) / base_rate : 0;
      const bool targeted = n == (std::size_t{16} << 20) && c.targeted();
      std::fprintf(out, "  %-12s %12zu %9.0f%% %9.0f%%%s\n", c.name.c_str(), n, 100 * er, 100 * dr,
                   targeted ? (er >= enc_target && dr >= dec_target ? "  target met" : "  target MISSED") : "");
    }
  }
}

void summarize(std::FILE* out, const RecordingReporter& rep) {
  if (!rep.runs.empty()) std::fprintf(out, "\n# %s\n", machine_line().c_str());
  summarize_family(out, rep, "encode", "decode", "copy", false, 0.40, 0.60);
  summarize_family(out, rep, "encode_cuda", "decode_cuda", "copy_cuda", true, 0.85, 0.85);
  bool header = false;
  for (const auto& [name, rates] : rep.runs) {
    if (name.rfind("topk_select/", 0) != 0) continue;
    const auto* nth = rep.find("nth_element/" + name.substr(12));
    if (!nth) continue;
    if (!header) {
      std::fprintf(out, "\n# top-k selection vs std::nth_element (same run); target >= 8x at n = 16M, k = 1%%\n");
      header = true;
    }
    const double speedup = nth->seconds / rates.seconds;
    const bool targeted = name.find("/16777216/") != std::string::npos;
    std::fprintf(out, "  %-28s %7.1fx%s\n", name.c_str(), speedup,
                 targeted ? (speedup >= 8 ? "  target met" : "  target MISSED") : "");
  }
}

}  // namespace
}  // namespace gz::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  gz::bench::add_machine_context();
  gz::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::fflush(stdout);
  gz::bench::summarize(reporter.console() ? stdout : stderr, reporter);
  benchmark::Shutdown();
  return 0;
}

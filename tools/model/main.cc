// gradzip-model: the cost model (comm/cost/cost_model.h) past this machine.
// Predicts the compressed allreduce and a DDP step for many ranks and link
// rates, flat (auto's choice among allgather and scatter_reduce, under the
// accuracy rules) and hierarchical, with this CPU's codec rates (measured,
// or from the rates cache) or a GPU's (BENCHMARKS.md section 2).
//
//   build/bin/gradzip-model --ranks 8,64,1024 --links 1gbit,10gbit,100gbit --rates h100
//   build/bin/gradzip-model --csv model.csv        # every codec, the default grid
//
// Layouts: "1/node" (every rank a node with its own link: auto among
// allgather and scatter_reduce) and "L/node" (--per-node ranks share each
// node's link: auto among those and hierarchical, which keeps the fp32
// traffic inside the node).
// One line per (rates, codec, layout, link, ranks): the algorithm, the
// predicted allreduce time and its parts, the fp32 baseline's time (codec
// none, the same layout), the speedup, and the DDP step (--compute-ms of
// forward and backward, then the allreduce of --size gradients, not
// overlapped: an upper bound on the step).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/engine/allreduce.h"
#include "comm/cost/auto_choice.h"
#include "comm/cost/codec_rates.h"
#include "comm/cost/cost_model.h"
#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/spec.h"
#include "compressors/wire_format.h"

namespace {

using namespace gz;

// GPU kernel rates at 64M floats, BENCHMARKS.md section 2: encode (with
// error feedback) and decode (one payload accumulated into the output) in
// microseconds; copy is cudaMemcpy D2D in GB/s.
struct GpuRow {
  const char* codec;
  double encode_us, decode_us;
};
struct GpuRates {
  const char* name;
  const char* source;
  double copy_gbs;
  std::vector<GpuRow> rows;
};
const std::vector<GpuRates>& gpus() {
  static const std::vector<GpuRates> g = {
      {"h100", "H100 80GB HBM3, BENCHMARKS section 2 (2026-11-23)", 2903,
       {{"none", 200.6, 295.6},
        {"fp16", 348.7, 254.8},
        {"bf16", 346.2, 252.9},
        {"onebit:block=512", 299.9, 204.1},
        {"topk:density=0.01", 621.0, 71.0}}},
      {"h200", "H200, BENCHMARKS section 2, GPU check run 2 (2026-11-26)", 4036,
       {{"none", 148.7, 208.9},
        {"fp16", 262.2, 184.3},
        {"bf16", 260.9, 211.0},
        {"onebit:block=512", 240.1, 161.0},
        {"topk:density=0.01", 538.7, 60.1},
        {"qsgd:bits=4,bucket=512", 627.7, 166.1},
        {"fp8:format=e4m3,block=512", 323.0, 170.0}}},
  };
  return g;
}

struct Options {
  std::vector<int> ranks = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<std::string> links = {"1gbit", "10gbit", "25gbit", "100gbit"};
  std::vector<std::string> codecs = {"fp16", "onebit", "topk", "qsgd", "fp8"};
  std::vector<std::string> rates = {"cpu", "h100", "h200"};
  int per_node = 8;
  std::size_t n = 100'000'000;
  double compute_ms = 0;
  double latency_us = 20;
  double message_us = 2;
  double compute_share = 1;
  bool all = false;
  std::string csv;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: gradzip-model [options]\n"
               "Predicted compressed allreduce and DDP step, by the cost model (comm/cost/cost_model.h).\n"
               "  --ranks LIST      rank counts (default 2,4,8,...,1024)\n"
               "  --links LIST      link rates, gradzip-run's syntax (default 1gbit,10gbit,25gbit,100gbit)\n"
               "  --codecs LIST     codec specs, ';'-free (default fp16,onebit,topk,qsgd,fp8)\n"
               "  --rates LIST      cpu (this machine: cached or measured), h100, h200, file:PATH (default\n"
               "                    cpu,h100,h200). PATH: lines 'SPEC ENCODE_NS DECODE_NS DECODE_EACH_NS' (ns per\n"
               "                    element; decode_sum of k payloads = DECODE + k DECODE_EACH) and\n"
               "                    'machine COPY_GBS SUM_NS SUM_EACH_NS'\n"
               "  --compute-share X codec work slowed X times (ranks sharing a core: 2 for 4 ranks on 2 cores)\n"
               "  --all             every algorithm auto may run, not only its choice\n"
               "  --per-node L      ranks per node of the second layout (default 8; the first: 1)\n"
               "  --size N          gradient elements (default 100000000)\n"
               "  --compute-ms T    forward + backward time of the DDP step (default 0)\n"
               "  --latency-us T    latency of one exchange (default 20)\n"
               "  --message-us T    cost of each peer's message in an exchange (default 2)\n"
               "  --csv FILE        also write the rows as CSV\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage(0);
    if (a == "--all") {
      o.all = true;
      continue;
    }
    if (i + 1 >= argc) usage(2);
    const std::string v = argv[++i];
    try {
      if (a == "--ranks") {
        o.ranks.clear();
        for (const auto& r : split(v)) {
          const int x = std::stoi(r);
          if (x < 1) throw std::invalid_argument("ranks");
          o.ranks.push_back(x);
        }
      } else if (a == "--links") {
        o.links = split(v);
        for (const auto& l : o.links) (void)parse_link_model(l);
      } else if (a == "--codecs") {
        o.codecs = split(v);
        for (const auto& c : o.codecs) (void)parse_spec(c);
      } else if (a == "--rates") {
        o.rates = split(v);
      } else if (a == "--per-node") {
        o.per_node = std::stoi(v);
      } else if (a == "--size") {
        o.n = static_cast<std::size_t>(std::stod(v));
      } else if (a == "--compute-ms") {
        o.compute_ms = std::stod(v);
      } else if (a == "--latency-us") {
        o.latency_us = std::stod(v);
      } else if (a == "--compute-share") {
        o.compute_share = std::stod(v);
        if (!(o.compute_share > 0)) throw std::invalid_argument("share");
      } else if (a == "--message-us") {
        o.message_us = std::stod(v);
      } else if (a == "--csv") {
        o.csv = v;
      } else {
        usage(2);
      }
    } catch (const gz::Error& e) {
      std::fprintf(stderr, "gradzip-model: %s\n", e.what());
      std::exit(2);
    } catch (const std::exception&) {
      std::fprintf(stderr, "gradzip-model: bad value '%s' for %s\n", v.c_str(), a.c_str());
      std::exit(2);
    }
  }
  if (o.per_node < 2) {
    std::fprintf(stderr, "gradzip-model: --per-node must be at least 2\n");
    std::exit(2);
  }
  return o;
}

// The rates of one source: per codec (canonical spec) and the machine's.
struct Source {
  std::string name, description;
  bool gpu = false;
  MachineRates machine;
  std::map<std::string, CodecRates> codecs;
  // nullptr when this source has no rates for the codec.
  const CodecRates* find(const CodecConfig& c) const {
    auto it = codecs.find(c.canonical());
    return it == codecs.end() ? nullptr : &it->second;
  }
};

Source cpu_source(const std::vector<CodecConfig>& needed) {
  Source s{"cpu", machine_identity() + ", one core per rank", false, {}, {}};
  RatesCache cache(RatesCache::default_path());
  s.machine = cache.machine();
  for (const auto& c : needed) s.codecs[c.canonical()] = cache.codec(c);
  return s;
}

// Rates given in a file (see --rates): each value checked, every codec named
// by its canonical spec.
Source file_source(const std::string& path) {
  std::ifstream f(path);
  if (!f) GZ_THROW(InvalidArgument, "--rates file:", path, ": cannot read");
  Source s{"file", path, false, {}, {}};
  bool machine = false;
  int line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string key;
    double a = 0, b = 0, c = 0;
    if (!(in >> key >> a >> b >> c) || a < 0 || b < 0 || c < 0 || !std::isfinite(a + b + c))
      GZ_THROW(InvalidArgument, path, ":", line_no, ": expected 'SPEC ENCODE_NS DECODE_NS DECODE_EACH_NS' or "
               "'machine COPY_GBS SUM_NS SUM_EACH_NS', got '", line, "'");
    if (key == "machine") {
      if (!(a > 0)) GZ_THROW(InvalidArgument, path, ":", line_no, ": the copy rate must be positive");
      s.machine = MachineRates{a * 1e9, b * 1e-9, c * 1e-9};
      machine = true;
      continue;
    }
    const CodecConfig cfg = parse_spec(key);
    constexpr std::size_t kRef = std::size_t{1} << 20;
    const double bytes = cfg.descriptor().lossless
                             ? 4.0
                             : static_cast<double>(make_codec(cfg)->max_payload_bytes(kRef) - wire::kHeaderBytes) / kRef;
    s.codecs[cfg.canonical()] = CodecRates{a * 1e-9, b * 1e-9, c * 1e-9, bytes};
  }
  if (!machine) GZ_THROW(InvalidArgument, path, ": no 'machine' line");
  return s;
}

Source gpu_source(const GpuRates& g) {
  Source s{g.name, g.source, true, {}, {}};
  s.machine.copy_bytes_per_s = g.copy_gbs * 1e9;
  constexpr double n = 67108864.0;
  for (const GpuRow& r : g.rows) {
    const CodecConfig cfg = parse_spec(r.codec);
    CodecRates rates;
    rates.encode_s = r.encode_us * 1e-6 / n;
    rates.decode_s = 0;
    rates.decode_each_s = r.decode_us * 1e-6 / n;
    constexpr std::size_t kRef = std::size_t{1} << 20;
    rates.bytes_per_element = cfg.descriptor().lossless
                                  ? 4.0
                                  : static_cast<double>(make_codec(cfg)->max_payload_bytes(kRef) - wire::kHeaderBytes) / kRef;
    s.codecs[cfg.canonical()] = rates;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    std::vector<CodecConfig> codecs;
    for (const auto& c : o.codecs) codecs.push_back(parse_spec(c));
    std::vector<CodecConfig> needed = {parse_spec("none")};
    for (const auto& c : codecs) {
      needed.push_back(c);
      needed.push_back(server_codec_config(c));
    }
    std::vector<Source> sources;
    for (const auto& r : o.rates) {
      if (r == "cpu") {
        sources.push_back(cpu_source(needed));
        continue;
      }
      if (r.rfind("file:", 0) == 0) {
        sources.push_back(file_source(r.substr(5)));
        continue;
      }
      bool found = false;
      for (const auto& g : gpus())
        if (r == g.name) {
          sources.push_back(gpu_source(g));
          found = true;
        }
      if (!found) GZ_THROW(InvalidArgument, "--rates: unknown source '", r, "' (cpu, h100, h200)");
    }
    std::FILE* csv = nullptr;
    if (!o.csv.empty()) {
      csv = std::fopen(o.csv.c_str(), "w");
      if (!csv) GZ_THROW(IoError, "cannot write ", o.csv);
      std::fprintf(csv, "rates,codec,layout,link,link_bps,ranks,algorithm,allreduce_ms,compute_ms,wire_ms,"
                        "baseline_algorithm,baseline_ms,speedup,step_ms,baseline_step_ms,step_speedup\n");
    }
    std::printf("# gradzip-model: %zu elements, DDP step = %.1f ms of compute + the allreduce, %d ranks per node "
                "(second layout), %.0f us per exchange + %.1f us per peer\n",
                o.n, o.compute_ms, o.per_node, o.latency_us, o.message_us);
    for (const Source& src : sources) {
      std::printf("# rates %s: %s\n", src.name.c_str(), src.description.c_str());
      std::printf("# %-26s %-12s %-8s %6s %-14s %11s %11s %10s %8s %10s %8s\n", "codec", "layout", "link", "ranks",
                  "algorithm", "total(ms)", "compute(ms)", "wire(ms)", "speedup", "step(ms)", "step_x");
      const CodecRates* none = src.find(parse_spec("none"));
      for (const CodecConfig& cfg : codecs) {
        const CodecRates* cr = src.find(cfg);
        const CodecRates* sr = src.find(server_codec_config(cfg));
        if (!cr || !sr || !none) {
          std::printf("# %s: no %s rates\n", cfg.canonical().c_str(), src.name.c_str());
          continue;
        }
        for (const std::string& link_text : o.links) {
          for (int P : o.ranks) {
            for (int hier = 0; hier < 2; ++hier) {
              const int L = hier ? o.per_node : 1;
              if (hier && (P % L != 0 || P / L < 2)) continue;
              const Topology topo = hier ? Topology::blocks(P, L) : Topology::flat(P);
              CostInputs in;
              in.n = o.n;
              in.ranks = P;
              in.per_node = L;
              in.machine = src.machine;
              in.link = parse_link_model(link_text);
              in.link.latency_s = std::max(in.link.latency_s, o.latency_us * 1e-6);
              in.link.per_message_s = o.message_us * 1e-6;
              in.ef = cfg.ef;
              in.compute_share = o.compute_share;
              // fp32 baseline: none, the same layout (the host sums floats; a GPU sends none's payloads).
              CostInputs base = in;
              base.codec = base.server = *none;
              base.raw = !src.gpu;
              base.ef = false;
              in.codec = *cr;
              in.server = *sr;
              in.inner = hier ? inner_algorithm(cfg, P / L) : Algorithm::Allgather;
              base.inner = hier ? inner_algorithm(parse_spec("none"), P / L) : Algorithm::Allgather;
              // auto's choice on this layout (with nodes of L: hierarchical among them).
              const std::vector<Algorithm> cand = auto_candidates(cfg, topo);
              const std::vector<Algorithm> base_cand = auto_candidates(parse_spec("none"), topo);
              const Algorithm chosen = fastest_algorithm(in, cand), b = fastest_algorithm(base, base_cand);
              const Prediction pb = predict(b, base);
              for (Algorithm a : o.all ? cand : std::vector<Algorithm>{chosen}) {
              const Prediction p = predict(a, in);
              const double t = p.total_s * 1e3, tb = pb.total_s * 1e3;
              const double step = o.compute_ms + t, base_step = o.compute_ms + tb;
              const std::string layout = hier ? std::to_string(L) + "/node" : "1/node";
              std::printf("  %-26s %-12s %-8s %6d %-14s %11.2f %11.2f %10.2f %8.2f %10.2f %8.2f\n",
                          cfg.canonical().c_str(), layout.c_str(), link_text.c_str(), P,
                          (std::string(to_string(a)) + (o.all && a == chosen ? "*" : "")).c_str(), t, p.compute_s * 1e3,
                          p.wire_s * 1e3, tb / t, step, base_step / step);
              if (csv)
                std::fprintf(csv, "%s,%s,%s,%s,%.6g,%d,%s,%.6g,%.6g,%.6g,%s,%.6g,%.6g,%.6g,%.6g,%.6g\n",
                             src.name.c_str(), cfg.canonical().c_str(), layout.c_str(), link_text.c_str(),
                             in.link.bits_per_s, P, to_string(a), t, p.compute_s * 1e3, p.wire_s * 1e3, to_string(b),
                             tb, tb / t, step, base_step, base_step / step);
              }
            }
          }
        }
      }
    }
    if (csv) std::fclose(csv);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradzip-model: %s\n", e.what());
    return 1;
  }
}

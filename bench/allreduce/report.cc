#include "bench/allreduce/report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace gz::bench {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

void print_header(const Options& o, int ranks, const std::string& transport_desc, const std::string& topology) {
  utsname u{};
  ::uname(&u);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::printf("# gradzip-bench: compressed allreduce, %d ranks\n", ranks);
  std::printf("# transport: %s   device: %s   algorithm: %s   iters: %d   warmup: %d\n", transport_desc.c_str(),
              to_string(o.device), to_string(o.algorithm), o.iters, o.warmup);
  const char* link = o.link.empty() ? std::getenv("GRADZIP_LINK") : o.link.c_str();
  std::printf("# topology: %s   link: %s   segment: %zu bytes\n", topology.c_str(), link ? link : "local",
              o.segment_bytes ? o.segment_bytes : kDefaultSegmentBytes);
  std::printf("# machine: %s (%s %s, %s), %ld cpus   %s\n", host, u.sysname, u.release, cpu_model().c_str(),
              ::sysconf(_SC_NPROCESSORS_ONLN), date);
  std::printf("# times: mean per call, max over ranks. wire: bytes one rank sends per call (with several\n"
              "# nodes: to other nodes, what crosses the links; node-local traffic is not counted). ratio: fp32\n"
              "# baseline wire bytes / this row's. speedup: baseline total / this row's total, where the\n"
              "# baseline is the uncompressed fp32 allreduce (none, scatter_reduce) on the same transport.\n"
              "# The calls are pipelined (seg: segments per call), so enc + dec + comm > total: enc and dec\n"
              "# are the codec's work, comm the time with bytes in flight, wait the part of it spent blocked.\n"
              "# hidden: the share of enc + dec that ran while bytes moved, (comm - wait) / (enc + dec),\n"
              "# least over ranks. rel_err: ||out - exact|| / ||exact|| of the first call (zero EF state).\n"
              "# workspace: bytes per rank beyond the buffer and EF state.\n");
  if (o.predict)
    std::printf("# pred: the cost model's time (comm/cost/cost_model.h), err = pred / total - 1; fit: the model\n"
                "# with the codec time this row measured (enc + dec, slowest rank) instead of the rates, fit_err\n"
                "# its error. limit: max(the link time of the wire bytes, bytes the codec touches / copy\n"
                "# bandwidth), x_lim = total / limit.\n");
  std::printf("#\n");
  std::printf("# %11s  %-26s %-14s %12s %7s %9s %9s %9s %9s %6s %4s %9s %8s %9s %12s  %s%s\n", "elements", "codec",
              "algorithm", "wire(B)", "ratio", "enc(ms)", "dec(ms)", "comm(ms)", "wait(ms)", "hidden", "seg",
              "total(ms)", "speedup", "rel_err", "workspace(B)", "check",
              o.predict ? "    pred(ms)    err    fit(ms) fit_err  limit(ms)  x_lim" : "");
  std::fflush(stdout);
}

void print_row(const Row& r) {
  char pred[128] = "";
  if (r.predicted_ms > 0)
    std::snprintf(pred, sizeof pred, "  %10.3f %+5.0f%% %10.3f %+6.0f%% %10.3f %6.2f", r.predicted_ms,
                  100 * (r.predicted_ms / r.total_ms - 1), r.predicted_fit_ms,
                  r.predicted_fit_ms > 0 ? 100 * (r.predicted_fit_ms / r.total_ms - 1) : 0.0, r.limit_ms,
                  r.limit_ms > 0 ? r.total_ms / r.limit_ms : 0.0);
  std::printf("  %11zu  %-26s %-14s %12zu %7.2f %9.3f %9.3f %9.3f %9.3f %5.0f%% %4zu %9.3f %8.2f %9.2e %12zu  %s%s%s%s\n",
              r.elements, r.codec.c_str(), r.native ? r.transport.c_str() : to_string(r.algorithm),
              r.wire_bytes, r.ratio, r.encode_ms, r.decode_ms, r.comm_ms, r.wait_ms, 100 * r.hidden, r.segments,
              r.total_ms, r.speedup, r.rel_error, r.workspace_bytes, r.ok ? "OK" : "FAILED",
              pred, r.note.empty() ? "" : ": ", r.note.c_str());
  std::fflush(stdout);
}

bool print_footer(const std::vector<Row>& rows) {
  int failed = 0;
  for (const auto& r : rows) failed += r.ok ? 0 : 1;
  std::printf("#\n# rows: %zu   failed: %d   (checks: ranks bit-identical, error within the codec's bound,\n"
              "#  workspace within (ranks + 1) payloads + n/ranks floats + 6 x ranks segments)\n# %s\n",
              rows.size(), failed, failed ? "FAILED" : "OK");
  std::fflush(stdout);
  return failed == 0;
}

std::string json_record(const Row& r) {
  std::ostringstream f;
  f << "{\"codec\": " << json_string(r.codec)
    << ", \"algorithm\": " << json_string(r.native ? r.transport : std::string(to_string(r.algorithm)))
    << ", \"transport\": " << json_string(r.transport) << ", \"ranks\": " << r.ranks
    << ", \"elements\": " << r.elements << ", \"wire_bytes_per_rank\": " << r.wire_bytes
    << ", \"local_bytes_per_rank\": " << r.local_bytes
    << ", \"ratio\": " << num(r.ratio) << ", \"encode_ms\": " << num(r.encode_ms)
    << ", \"comm_ms\": " << num(r.comm_ms) << ", \"decode_ms\": " << num(r.decode_ms)
    << ", \"wait_ms\": " << num(r.wait_ms) << ", \"hidden\": " << num(r.hidden)
    << ", \"segments\": " << r.segments
    << ", \"total_ms\": " << num(r.total_ms) << ", \"baseline_ms\": " << num(r.baseline_ms)
    << ", \"speedup\": " << num(r.speedup) << ", \"rel_error\": " << num(r.rel_error)
    << ", \"error_bound\": " << num(r.error_bound) << ", \"predicted_ms\": " << num(r.predicted_ms)
    << ", \"predicted_fit_ms\": " << num(r.predicted_fit_ms) << ", \"limit_ms\": " << num(r.limit_ms) << ", \"workspace_bytes\": " << r.workspace_bytes
    << ", \"identical\": " << (r.identical ? "true" : "false") << ", \"ok\": " << (r.ok ? "true" : "false")
    << "}";
  return f.str();
}

void write_json(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) GZ_THROW(IoError, "cannot write ", path);
  f << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) f << "  " << json_record(rows[i]) << (i + 1 < rows.size() ? "," : "") << "\n";
  f << "]\n";
  if (!f) GZ_THROW(IoError, "writing ", path, " failed");
}

void append_jsonl(const std::string& path, const Row& row) {
  std::ofstream f(path, std::ios::app);
  if (!f) GZ_THROW(IoError, "cannot append to ", path);
  f << json_record(row) << "\n" << std::flush;
  if (!f) GZ_THROW(IoError, "appending to ", path, " failed");
}

}  // namespace gz::bench

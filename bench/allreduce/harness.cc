#include "bench/allreduce/harness.h"

#include "common/fingerprint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/base/memory.h"
#include "common/error.h"

namespace gz::bench {
namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double unit(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0; }  // [-1, 1)

// Rank r's input: noise of its own plus a component shared by all ranks
// (constant over runs of 64 elements), so the sum has structure to keep.
float input(int r, std::size_t i) {
  return static_cast<float>(unit(mix((std::uint64_t(r) << 40) ^ i)) + 0.5 * unit(mix(0xB1A5ull << 40 ^ (i >> 6))));
}

}  // namespace

struct Harness::Impl {
  Communicator& comm;
  const Options& o;
  int P, me;
  std::vector<float> host_in, host_out;
  Buffer device_buf{MemoryKind::Device};
  Stream stream = nullptr;

  Buffer device_small{MemoryKind::Device};

  // Elementwise max over ranks of a few doubles. Allgathered from the bench's
  // device: NCCL moves device buffers only, so with --device cuda they are
  // staged through device memory.
  std::vector<double> max_over_ranks(const std::vector<double>& mine) {
    const std::size_t k = mine.size(), P_ = static_cast<std::size_t>(P);
    std::vector<double> all(k * P_);
    std::vector<Slice> slots(P_);
    std::vector<std::size_t> got(P_);
    const CallContext ctx{o.device, stream, comm.timeout()};
    if (o.device == Device::Cpu) {
      for (std::size_t r = 0; r < P_; ++r) slots[r] = {all.data() + k * r, 8 * k};
      comm.transport().allgatherv({mine.data(), 8 * k}, slots, got, ctx);
    } else {
      device_small.reserve(8 * k * (P_ + 1));
      auto* dev = static_cast<double*>(device_small.data());
      mem::from_host(dev + k * P_, mine.data(), 8 * k, o.device, stream);
      for (std::size_t r = 0; r < P_; ++r) slots[r] = {dev + k * r, 8 * k};
      comm.transport().allgatherv({dev + k * P_, 8 * k}, slots, got, ctx);
      mem::to_host(all.data(), dev, 8 * k * P_, o.device, stream);
    }
    std::vector<double> m(mine);
    for (int r = 0; r < P; ++r)
      for (std::size_t j = 0; j < k; ++j) m[j] = std::max(m[j], all[k * static_cast<std::size_t>(r) + j]);
    return m;
  }
  float* buffer(std::size_t n) {
    if (o.device == Device::Cpu) return host_out.data();
    device_buf.reserve(4 * n);
    return static_cast<float*>(device_buf.data());
  }
  void load(std::size_t n) {  // the input into the buffer (untimed)
    if (o.device == Device::Cpu)
      std::memcpy(host_out.data(), host_in.data(), 4 * n);
    else
      mem::from_host(buffer(n), host_in.data(), 4 * n, o.device, stream);
  }
  void fetch(std::size_t n) {
    if (o.device != Device::Cpu) mem::to_host(host_out.data(), buffer(n), 4 * n, o.device, stream);
  }
  void prepare(std::size_t n) {
    host_in.resize(n);
    host_out.resize(n);
    for (std::size_t i = 0; i < n; ++i) host_in[i] = input(me, i);
  }
  double rel_error(std::size_t n) const {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int r = 0; r < P; ++r) exact += input(r, i);
      const double d = host_out[i] - exact;
      num += d * d;
      den += exact * exact;
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }
};

Harness::Harness(Communicator& comm, const Options& options) : impl_(new Impl{comm, options, comm.size(), comm.rank(), {}, {}, Buffer(MemoryKind::Device), nullptr}) {}

Harness::~Harness() { delete impl_; }

Row Harness::run(const std::string& spec, std::size_t n, Algorithm algorithm) {
  Impl& m = *impl_;
  auto codec = make_codec(spec);
  Row row;
  row.codec = codec->spec();
  {
    AllreduceCall what;  // auto: what the communicator runs (the cost model's choice when it has a link)
    what.algorithm = algorithm;
    what.segment_bytes = m.o.segment_bytes;
    what.device = m.o.device;
    row.algorithm = m.comm.resolve_algorithm(*codec, n, what);
  }
  row.transport = m.o.transport;
  row.ranks = m.P;
  row.elements = n;
  row.error_bound = allreduce_error_bound(codec->config());
  m.prepare(n);

  ErrorFeedback state;
  AllreduceStats stats;
  AllreduceCall call;
  call.algorithm = row.algorithm;
  call.device = m.o.device;
  call.stream = m.stream;
  call.segment_bytes = m.o.segment_bytes;
  call.stats = &stats;

  // First call from zero EF state: the error and the cross-rank check.
  m.load(n);
  m.comm.allreduce(m.buffer(n), n, *codec, state, call);
  m.fetch(n);
  row.rel_error = m.rel_error(n);
  const std::uint64_t fp = fingerprint(m.host_out.data(), n);
  const double fp_hi = static_cast<double>(fp >> 32), fp_lo = static_cast<double>(fp & 0xFFFFFFFFu);
  // max == -max(-x) for every rank iff all ranks hold the same value.
  const auto hi = m.max_over_ranks({fp_hi, -fp_hi, fp_lo, -fp_lo});
  row.identical = hi[0] == -hi[1] && hi[2] == -hi[3];

  for (int i = 0; i < m.o.warmup; ++i) {
    m.load(n);
    m.comm.allreduce(m.buffer(n), n, *codec, state, call);
  }
  double enc = 0, com = 0, dec = 0, tot = 0, wait = 0;
  std::size_t wire = 0, local = 0;
  // With several nodes, what crosses them is what the links carry: the wire
  // column counts it, and the node-local bytes apart.
  const bool nodes = m.comm.topology().nodes() > 1;
  for (int i = 0; i < m.o.iters; ++i) {
    m.load(n);
    m.comm.transport().barrier(CallContext{m.o.device, m.stream, m.comm.timeout()});  // start together
    m.comm.allreduce(m.buffer(n), n, *codec, state, call);
    enc += stats.encode_s;
    com += stats.comm_s;
    dec += stats.decode_s;
    tot += stats.total_s;
    wait += stats.wait_s;
    wire = std::max(wire, nodes ? stats.remote_bytes : stats.wire_bytes);
    local = std::max(local, nodes ? stats.wire_bytes - stats.remote_bytes : 0);
  }
  const double k = 1e3 / m.o.iters;
  if (m.o.predict) {
    if (const auto in = m.comm.cost_inputs(*codec, n, call)) {
      const Prediction p = predict(row.algorithm, *in);
      row.predicted_ms = p.total_s * 1e3;
      row.limit_ms = memory_limit(row.algorithm, *in) * 1e3;
      // The model again with this row's own codec time (the slowest rank's
      // enc + dec): what is left of the error is the pipeline and the wire,
      // not the rates (on a loaded machine the codec work slows unevenly).
      const double measured = [&] {
        const auto mx = m.max_over_ranks({(enc + dec) / m.o.iters});
        return mx[0];
      }();
      if (p.compute_s > 0 && measured > 0) {
        CostInputs fit = *in;
        fit.compute_share *= measured / p.compute_s;
        row.predicted_fit_ms = predict(row.algorithm, fit).total_s * 1e3;
      }
    }
  }
  // The hidden share of each rank, then the least over ranks (as -max(-x)).
  const double compute = enc + dec;
  const double hidden = compute > 0 ? std::clamp((com - wait) / compute, 0.0, 1.0) : 0.0;
  const auto mx = m.max_over_ranks(
      {enc * k, com * k, dec * k, tot * k, static_cast<double>(wire), wait * k, -hidden, static_cast<double>(stats.segments),
       static_cast<double>(local)});
  row.encode_ms = mx[0];
  row.comm_ms = mx[1];
  row.decode_ms = mx[2];
  row.total_ms = mx[3];
  row.wire_bytes = static_cast<std::size_t>(mx[4]);
  row.wait_ms = mx[5];
  row.hidden = -mx[6];
  row.segments = static_cast<std::size_t>(mx[7]);
  row.local_bytes = static_cast<std::size_t>(mx[8]);

  // The workspace: what the call laid out (its segments' slots and sums),
  // and the bound docs/comm.md promises: (P + 1) payloads of the whole buffer
  // (of the larger of the codec and its server codec) + n/P floats, plus 6P
  // slots of a segment (3 per member per segment in flight) and two
  // segments' sums, plus the codec's scratch.
  const std::size_t C = std::max(codec->max_payload_bytes(n),
                                 make_codec(server_codec_config(codec->config()))->max_payload_bytes(n));
  const std::size_t P_ = static_cast<std::size_t>(m.P);
  const std::size_t segment = (m.o.segment_bytes ? m.o.segment_bytes : kDefaultSegmentBytes) + 256;
  const std::size_t codec_ws = codec->workspace_bytes(n, m.o.device);  // at most: segments are shorter
  row.workspace_bytes = AllreduceWorkspace::comm_bytes_for(*codec, n, m.P, m.me, row.algorithm, m.o.segment_bytes,
                                                           &m.comm.topology(), m.o.device) +
                        codec_ws;
  row.workspace_bound = (P_ + 1) * C + 4 * ((n + P_ - 1) / P_) + 6 * P_ * segment + 8 * segment + codec_ws;
  row.ok = row.identical && row.rel_error <= row.error_bound && row.workspace_bytes <= row.workspace_bound;
  if (!row.identical) row.note = "ranks disagree";
  else if (row.rel_error > row.error_bound) row.note = "error above bound";
  else if (row.workspace_bytes > row.workspace_bound) row.note = "workspace above bound";
  return row;
}

Row Harness::run_native_allreduce(std::size_t n) {
  Impl& m = *impl_;
  Transport& t = m.comm.transport();
  GZ_ENFORCE(t.native_allreduce() != nullptr, "the ", t.name(), " transport has no allreduce of its own");
  Row row;
  row.codec = t.native_allreduce();
  row.native = true;
  row.transport = m.o.transport;
  row.ranks = m.P;
  row.elements = n;
  m.prepare(n);
  const CallContext ctx{m.o.device, m.stream, m.comm.timeout()};
  for (int i = 0; i < m.o.warmup; ++i) {
    m.load(n);
    t.native_allreduce_sum(m.buffer(n), n, ctx);
  }
  double tot = 0;
  for (int i = 0; i < m.o.iters; ++i) {
    m.load(n);
    t.barrier(ctx);
    const auto t0 = std::chrono::steady_clock::now();
    t.native_allreduce_sum(m.buffer(n), n, ctx);
    tot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  m.fetch(n);
  row.total_ms = m.max_over_ranks({tot * 1e3 / m.o.iters})[0];
  row.comm_ms = row.total_ms;
  row.wire_bytes = 2 * (static_cast<std::size_t>(m.P) - 1) * 4 * n / static_cast<std::size_t>(m.P);
  row.rel_error = m.rel_error(n);
  row.error_bound = 1e-6;
  row.ok = row.rel_error <= row.error_bound;
  return row;
}

}  // namespace gz::bench

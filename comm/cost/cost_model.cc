#include "comm/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "comm/algorithms/algorithm.h"
#include "common/error.h"
#include "common/units.h"

namespace gz {

namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return b ? (a + b - 1) / b : 0; }

double link_bytes_per_s(const CostInputs& in) { return in.link.bits_per_s / 8.0 * in.link.efficiency; }
double local_bytes_per_s(const CostInputs& in) {
  return in.link.local_bytes_per_s > 0 ? in.link.local_bytes_per_s : in.machine.copy_bytes_per_s / 2;
}

}  // namespace

// Wire time of one exchange in which this rank sends `bytes` to each other
// member (and receives as many from each).
double exchange_seconds(const CostInputs& in, const CostGroup& g, double bytes) {
  const int remote = g.members - 1 - g.local_peers;
  double t = 0;
  // The link and the transport's own work on the bytes run at once: the
  // slower of the two sets the pace.
  if (remote > 0)
    t = std::max(g.sharers * remote * bytes / link_bytes_per_s(in), remote * bytes * in.link.transport_s_per_byte) +
        in.link.latency_s;
  if (g.local_peers > 0) t = std::max(t, g.local_peers * bytes / local_bytes_per_s(in));
  return t + (g.members - 1) * in.link.per_message_s;
}

// CPU time of moving `bytes` through the transport on this rank (sent and
// received: a copy each, the sockets' or shared memory's).
double transport_cpu_seconds(const CostInputs& in, const CostGroup& g, double bytes) {
  return 2.0 * (g.members - 1) * bytes / in.machine.copy_bytes_per_s;
}

double sum_seconds(const CostInputs& in, double m, int k) { return m * (in.machine.sum_s + k * in.machine.sum_each_s); }
double decode_seconds(const CodecRates& r, double m, int k) { return m * (r.decode_s + k * r.decode_each_s); }

Prediction flat_allgather_prediction(const CostInputs& in, const CostGroup& g, std::size_t count) {
  Prediction p;
  if (count == 0 || g.members < 1) return p;
  const double c = codec_bytes(in);
  const std::size_t seg = model_segment_elems(count, c, in.segment_bytes);
  const std::size_t S = ceil_div(count, seg);
  const double m = static_cast<double>(count) / static_cast<double>(S);  // mean segment
  const double e = in.raw ? 0.0 : m * in.codec.encode_s;
  double d = in.raw ? sum_seconds(in, m, g.members) : decode_seconds(in.codec, m, g.members);
  d += transport_cpu_seconds(in, g, m * c);
  const double w = g.members > 1 ? exchange_seconds(in, g, m * c) : 0.0;
  p.segments = S;
  p.compute_s = S * (e + d) * in.compute_share;
  p.wire_s = S * w;
  p.total_s = pipeline_seconds(S, e * in.compute_share, d * in.compute_share, w);
  return p;
}

Prediction flat_scatter_reduce_prediction(const CostInputs& in, const CostGroup& g, std::size_t count) {
  Prediction p;
  if (count == 0 || g.members < 1) return p;
  const auto G = static_cast<std::size_t>(g.members);
  const std::size_t chunk = ceil_div(count, G);
  const double c = codec_bytes(in), s = server_bytes(in);
  const std::size_t seg = model_segment_elems(chunk, std::max(c, s), in.segment_bytes);
  const std::size_t S = ceil_div(chunk, seg);
  const double m = static_cast<double>(chunk) / static_cast<double>(S);
  double e = 0, d = 0;
  if (in.raw) {
    d = sum_seconds(in, m, g.members);  // the owner's sum; the gather lands in place
  } else {
    e = g.members * m * in.codec.encode_s;              // scatter: every chunk's segment
    d = decode_seconds(in.codec, m, g.members)          // reduce: the members' payloads
        + m * in.server.encode_s                        // the chunk sum, again
        + g.members * decode_seconds(in.server, m, 1);  // gather: each chunk's payload
  }
  d += transport_cpu_seconds(in, g, m * (c + s));
  const double w = g.members > 1 ? exchange_seconds(in, g, m * c) + exchange_seconds(in, g, m * s) : 0.0;
  p.segments = S;
  p.compute_s = S * (e + d) * in.compute_share;
  p.wire_s = S * w;
  p.total_s = pipeline_seconds(S, e * in.compute_share, d * in.compute_share, w);
  return p;
}

CostGroup world_group(const CostInputs& in) {
  const int L = std::max(1, in.per_node);
  return CostGroup{in.ranks, L - 1, L};
}

LinkModel parse_link_model(std::string_view text) {
  // gradzip-run --link's own parser (common/units.h): one syntax and one
  // range for the launcher, the benchmark's --link, GRADZIP_LINK and
  // gradzip-model, and gradzip's exception type.
  units::Link link;
  try {
    link = units::parse_link(text);
  } catch (const std::invalid_argument& e) {
    GZ_THROW(InvalidArgument, "link '", text, "': ", e.what());
  }
  LinkModel l;
  l.bits_per_s = static_cast<double>(link.rate_bps);
  l.latency_s = static_cast<double>(link.delay_ns) * 1e-9;
  return l;
}

double exchange_seconds(const CostInputs& in, int members, int local_peers, int sharers, double bytes) {
  return exchange_seconds(in, CostGroup{members, local_peers, sharers}, bytes);
}

double pipeline_seconds(std::size_t S, double e, double d, double w) {
  if (S == 0) return 0;
  const double n = static_cast<double>(S);
  return std::max(n * (e + d) + std::max(0.0, w - d), e + n * w + d);
}

std::size_t model_segment_elems(std::size_t unit, double bytes_per_element, std::size_t segment_bytes) {
  // Run::wire_for: segment_bytes of payload (default 1 MiB); by default at
  // least 8 segments unless that makes them shorter than 64K elements; no
  // longer than the run.
  constexpr std::size_t kMinSegments = 8, kMinSegmentElems = std::size_t{1} << 16;
  const double target = static_cast<double>(segment_bytes ? segment_bytes : std::size_t{1} << 20);
  auto seg = static_cast<std::size_t>(std::clamp(target / std::max(bytes_per_element, 1e-9), 64.0, 1e12));
  if (segment_bytes == 0) seg = std::min(seg, std::max(kMinSegmentElems, ceil_div(unit, kMinSegments)));
  return std::max<std::size_t>(1, std::min(seg, std::max<std::size_t>(unit, 1)));
}

double burst_credit_seconds(const CostInputs& in) {
  const bool remote = in.ranks > std::max(1, in.per_node);
  return remote && in.link.bits_per_s > 0 ? in.link.burst_bytes / link_bytes_per_s(in) : 0.0;
}

Prediction predict(Algorithm a, const CostInputs& in) {
  const AlgorithmDescriptor& d = algorithm_descriptor(a);
  if (!d.predict) GZ_THROW(InvalidArgument, "no cost formula for algorithm '", d.name, "'");
  // No credit for the link's bucket here: on the emulated cluster a call
  // finds it partly refilled (by the gap before it) and its bytes still
  // paced by TCP restarting after idle (measured: 0.26 MB in 1.2 ms on an
  // idle 1 Gbit/s link with a 0.5 MB bucket), neither of which the model
  // knows; memory_limit, a bound, takes the whole bucket.
  return d.predict(in);
}

double memory_bytes(Algorithm a, const CostInputs& in) {
  const AlgorithmDescriptor& d = algorithm_descriptor(a);
  return d.memory_bytes ? d.memory_bytes(in) : 0;
}

double memory_limit(Algorithm a, const CostInputs& in) {
  const AlgorithmDescriptor& d = algorithm_descriptor(a);
  if (!d.memory_bytes || !d.bytes_per_peer) return 0;
  // A bound takes the optimist's side of every input: the link's line rate
  // (TCP's headers only add; the 0.99 payload share is a measured figure,
  // which 2-rank rows beat by 0.03%), none of the transport's pace (a
  // faster machine would beat it), the bucket's bytes free; one core's own
  // copy rate (ranks sharing the memory bus only slow it: the concurrent
  // copy's slowdown, which the memory term once took, put 7 onebit and
  // top-k rows below it).
  CostInputs bound = in;
  bound.link.transport_s_per_byte = 0;
  bound.link.per_message_s = 0;
  bound.link.efficiency = 1;
  const double link =
      in.ranks > 1 ? std::max(0.0, exchange_seconds(bound, world_group(in), d.bytes_per_peer(in)) -
                                       in.link.latency_s - burst_credit_seconds(bound))
                   : 0.0;
  const double memory = d.memory_bytes(in) / (2 * in.machine.copy_bytes_per_s);
  return std::max(link, memory);
}

}  // namespace gz

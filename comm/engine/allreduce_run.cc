// What the algorithms share: flights (timed, aborted on error), segment
// sizes and the codec of a phase's segments.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/engine/allreduce_run.h"
#include "common/error.h"
#include "common/workspace.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"

namespace gz::detail {

namespace {

// The default cut (o.segment_bytes == 0): at least this many segments per
// run, of at least this many elements.
constexpr std::size_t kMinSegments = 8;
constexpr std::size_t kMinSegmentElems = std::size_t{1} << 16;

}  // namespace

Run::Run(const AllreduceOptions& opt)
    : Run(opt, opt.transport->size(), opt.transport->rank(), opt.transport->exact_sizes(),
          opt.transport->device_memory()) {
  t = opt.transport;
  call = CallContext{o.device, o.stream, o.timeout};
  // Exchanges move the payload slots: device memory for a transport that
  // takes it, else host (pinned, under CUDA) memory.
  exchange_call = CallContext{device_memory ? o.device : Device::Cpu, o.stream, o.timeout};
}

Run::Run(const AllreduceOptions& opt, int ranks, int rank, bool exact_sizes, bool transport_device_memory)
    : o(opt),
      t(nullptr),
      codec(*opt.codec),
      st(*opt.state),
      ws(*opt.workspace),
      P(ranks),
      me(rank),
      exact(exact_sizes),
      device_memory(transport_device_memory),
      send_ops(opt.workspace->sends_),
      recv_ops(opt.workspace->recvs_),
      received_bytes(opt.workspace->received_),
      payload_refs(opt.workspace->payloads_) {
  topo = o.topology ? *o.topology : Topology::flat(P);
  algo = resolve_algorithm(o.algorithm, codec.config(), topo, o.server_codec ? &*o.server_codec : nullptr);
  raw = codec.descriptor().lossless && o.device == Device::Cpu;
  seg = segment_elems(codec, raw);
  server_cfg = o.server_codec ? *o.server_codec : server_codec_config(codec.config());
  server_cfg.ef = codec.config().ef && !server_cfg.descriptor().lossless;
  // none sums exact values (as floats on the host): nothing to re-encode.
  if (codec.descriptor().lossless && !(server_cfg == codec.config()))
    GZ_THROW(InvalidArgument, "codec none sends exact values; its chunk sums cannot go as server_codec '",
             server_cfg.canonical(), "'");
  stats.algorithm = algo;
  timer.reset(o.stats != nullptr, o.device, o.stream);
}

Group Run::world() const {
  Group g;
  g.ranks.resize(static_cast<std::size_t>(P));
  std::iota(g.ranks.begin(), g.ranks.end(), 0);
  g.me = me;
  return g;
}

namespace {

// Segments are whole runs of this many elements: the codec's granule (so
// that segmenting changes no bit), in runs of 64 (aligned vector loops).
std::size_t segment_granule(const Codec& c) {
  const auto granule = c.descriptor().segment_granule;
  return granule ? std::lcm<std::size_t>(granule(c.config()), 64) : 64;
}

}  // namespace

std::size_t Run::segment_elems(const Codec& c, bool raw_floats) const {
  const std::size_t target = o.segment_bytes ? o.segment_bytes : kDefaultSegmentBytes;
  // Payload bytes per element, from a long run (headers aside).
  constexpr std::size_t kRef = std::size_t{1} << 20;
  const double per = raw_floats ? 4.0 : static_cast<double>(c.max_payload_bytes(kRef) - wire::kHeaderBytes) / kRef;
  const std::size_t unit = segment_granule(c);
  const double units = static_cast<double>(target) / per / static_cast<double>(unit);
  // Capped so that a segment's slot stays addressable (sparse codecs at tiny rates).
  return static_cast<std::size_t>(std::clamp(units, 1.0, 1e12 / static_cast<double>(unit))) * unit;
}

Wire Run::wire_for(std::size_t unit, bool two_phase) {
  // No segment longer than the run it cuts (slots and sums are sized by it).
  // By default also at least kMinSegments of them, unless that makes them
  // shorter than kMinSegmentElems: a well compressed payload of a large
  // buffer is small on the wire, but encoding it is not, and a pipeline of
  // one or two segments hides nothing.
  auto fit = [&](std::size_t seg_elems, std::size_t granule) {
    if (o.segment_bytes == 0)
      seg_elems = std::min(seg_elems, std::max(kMinSegmentElems, (unit + kMinSegments - 1) / kMinSegments));
    return std::min(align_up(seg_elems, granule), std::max(granule, align_up(unit, granule)));
  };
  if (raw) return Wire{nullptr, nullptr, true, fit(segment_elems(codec, true), 64)};
  // The codec of a segment, where the descriptor says it differs from the
  // whole run's (top-k k=K: every segment keeps the share K / unit).
  auto per_segment = [&](const CodecConfig& cfg, std::unique_ptr<Codec>& made) -> Codec* {
    CodecConfig d = cfg;
    const auto segment_config = cfg.descriptor().segment_config;
    if (segment_config && unit > 0 && !segment_config(cfg, unit, &d)) d = cfg;
    if (d == codec.config()) return &codec;
    if (!made || !(made->config() == d)) made = make_codec(d);
    return made.get();
  };
  Codec* c = per_segment(codec.config(), ws.segment_codec_);
  Codec* server = !two_phase || server_cfg == codec.config() ? nullptr : per_segment(server_cfg, ws.server_codec_);
  // Segments of about segment_bytes of the larger of the two payloads, on
  // whole blocks of both.
  std::size_t seg_elems = segment_elems(*c, false), granule = segment_granule(*c);
  if (server) {
    seg_elems = std::min(seg_elems, segment_elems(*server, false));
    granule = std::lcm(granule, segment_granule(*server));
  }
  seg_elems = fit(seg_elems, granule);
  if (seg_elems >= unit) c = &codec;  // one segment: exactly the unsegmented call
  return Wire{c, server ? server : c, false, seg_elems};
}

Wire Run::fp32_wire(std::size_t unit) {
  if (raw) return wire_for(unit, false);
  if (!ws.none_codec_) ws.none_codec_ = make_codec("none");
  const std::size_t seg_elems = std::min(segment_elems(*ws.none_codec_, false), std::max<std::size_t>(64, align_up(unit, 64)));
  return Wire{ws.none_codec_.get(), ws.none_codec_.get(), false, seg_elems};  // fp32 segments are long on the wire already
}

Flight Run::start(std::span<const SendOp> sends, std::span<const RecvOp> recvs) {
  const int node = topo.node[static_cast<std::size_t>(me)];
  for (const SendOp& s : sends) {
    stats.wire_bytes += s.data.bytes;
    if (topo.node[static_cast<std::size_t>(s.peer)] != node) stats.remote_bytes += s.data.bytes;
  }
  Flight f;
  f.start = Clock::now();
  f.x = t->start(sends, recvs, exchange_call);
  f.live = true;
  return f;
}

void Run::finish(Flight& f) {
  if (!f.live) return;
  const auto t0 = Clock::now();
  t->wait(f.x);
  f.live = false;
  const auto t1 = Clock::now();
  stats.wait_s += std::chrono::duration<double>(t1 - t0).count();
  busy.emplace_back(f.start, t1);
}

void Run::poke(Flight& f) {
  if (f.live && t->test(f.x)) {
    f.live = false;
    busy.emplace_back(f.start, Clock::now());
  }
}

void Run::abort_flights(std::span<Flight> flights, const char* why) {
  for (const Flight& f : flights)
    if (f.live) {
      t->abort(why);  // the exchanges cannot finish: peers see an error, not silence
      return;
    }
}

void Run::before_send() {
  // Kernels wrote the payload into pinned memory the host transport reads.
  if (o.device == Device::Cuda && !device_memory) mem::synchronize(o.device, o.stream);
}

ConstSlice Run::send_payload(const std::byte* slot, std::size_t bytes, const Codec& c, std::size_t count) const {
  if (bare(c)) {
    GZ_ENFORCE(bytes == c.max_payload_bytes(count), "a fixed-size ", c.spec(), " payload of ", count,
               " elements is ", c.max_payload_bytes(count), " bytes, not ", bytes);
    return ConstSlice{slot + wire::kHeaderBytes, bytes - wire::kHeaderBytes};
  }
  return ConstSlice{slot, exact ? bytes : c.max_payload_bytes(count)};
}

Slice Run::recv_payload(std::byte* slot, const Codec& c, std::size_t count, std::size_t capacity) const {
  if (bare(c))
    return Slice{slot + wire::kHeaderBytes, (exact ? capacity : c.max_payload_bytes(count)) - wire::kHeaderBytes};
  return Slice{slot, exact ? capacity : c.max_payload_bytes(count)};
}

PayloadRef Run::arrived(std::byte* slot, std::size_t received, std::size_t capacity, const Codec& c,
                        std::size_t count) {
  if (bare(c)) {
    // The header every rank's agreement implies; the decode holds the body
    // that arrived to it (its size) like any payload's.
    c.write_header(count, slot);  // host memory (bare)
    return {slot, wire::kHeaderBytes + std::min(received, capacity - wire::kHeaderBytes)};
  }
  if (exact) return {slot, received};
  // The sender sent the codec's bound for the count (send_payload). A
  // fixed-size payload is exactly that; otherwise the header says how much
  // of it is the payload.
  if (!payload_size_varies(c)) return {slot, c.max_payload_bytes(count)};
  const std::size_t sent = std::min(received, capacity);
  if (sent < wire::kHeaderBytes) return {slot, sent};  // the decode rejects it
  std::byte head[wire::kHeaderBytes];
  mem::to_host(head, slot, sizeof head, o.device, o.stream);
  std::uint64_t body = 0;
  std::memcpy(&body, head + 24, sizeof body);
  return {slot, body <= sent - wire::kHeaderBytes ? wire::kHeaderBytes + body : sent};
}

void Run::check_decodes() {
  if (exec.status) check_payload_status(exec.status, o.stream);
}

void Run::finish_stats(Clock::time_point start) {
  if (!o.stats) return;
  timer.collect();
  // Time with at least one exchange in flight: the union of the flights.
  std::sort(busy.begin(), busy.end());
  Clock::time_point edge{};
  for (const auto& [b, e] : busy) {
    const auto from = std::max(b, edge);
    if (e > from) stats.comm_s += std::chrono::duration<double>(e - from).count();
    edge = std::max(edge, e);
  }
  stats.total_s = std::chrono::duration<double>(Clock::now() - start).count();
  *o.stats = stats;
}


void expect_floats(std::size_t received, std::size_t count, int rank) {
  if (received != 4 * count)
    GZ_THROW(PayloadError, "rank ", rank, " sent ", received, " bytes for a segment of ", count,
             " floats (the ranks disagree on the call)");
}

Slots::Slots(Carve& c, std::size_t sets, std::size_t count, std::size_t bytes)
    : stride(align_up(bytes, kWorkspaceAlign)), per_set(count) {
  base = c.add<std::byte>(sets * count * stride);
}

void Run::sum_segment(const Group& g, const Wire& w, const Slots& slots, std::size_t set, const std::size_t* received,
                      const float* own, std::size_t own_bytes, std::size_t count, std::size_t cap, float scale_by,
                      float* target) {
  const auto Pg = static_cast<std::size_t>(g.size()), m = static_cast<std::size_t>(g.me);
  timer.begin();
  if (w.raw) {
    ws.inputs_.clear();
    for (std::size_t i = 0; i < Pg; ++i) {
      if (i != m) expect_floats(received[i], count, g.ranks[i]);
      ws.inputs_.push_back(i == m ? own : slots.floats(set, i));
    }
    kernels::cpu::sum(ws.inputs_.data(), Pg, count, scale_by, target);
  } else {
    ws.payloads_.clear();
    for (std::size_t i = 0; i < Pg; ++i)
      ws.payloads_.push_back(i == m ? PayloadRef{slots.at(set, i), own_bytes}
                                    : arrived(slots.at(set, i), received[i], cap, *w.codec, count));
    w.codec->decode_sum(ws.payloads_, target, count, scale_by, exec);
  }
  timer.end(&stats.decode_s);
}

std::size_t Run::kept_size(const Codec& c, const std::byte* slot, std::size_t count, std::size_t cap) const {
  if (!payload_size_varies(c)) return c.max_payload_bytes(count);  // fixed-size payloads
  std::byte head[wire::kHeaderBytes];  // the sender's header says
  mem::to_host(head, slot, sizeof head, o.device, o.stream);
  std::uint64_t body = 0;
  std::memcpy(&body, head + 24, sizeof body);
  return body <= cap - wire::kHeaderBytes ? wire::kHeaderBytes + body : cap;
}

}  // namespace gz::detail

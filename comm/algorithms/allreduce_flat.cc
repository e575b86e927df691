// The flat algorithms, pipelined: allgather and scatter_reduce over one group
// of ranks (the world, or a node or a column of nodes in hierarchical).
//
// Both cut their work into segments (allreduce_run.h) and keep two in
// flight, as gloo's ring() does: while one segment's exchange moves bytes,
// the next segment is encoded and the previous one decoded. Each exchange
// uses one of two slot sets, by segment parity; a set is reused only after
// the exchange that used it finished and its payloads were decoded. Every
// rank posts the same exchanges in the same order, which is all the
// transport's matching rule needs.
#include <algorithm>
#include <cstring>

#include "comm/engine/allreduce_run.h"
#include "common/error.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"

namespace gz::detail {
namespace {

// Two segments in flight, or one when there is only one.
std::size_t sets_for(std::size_t segments) { return std::min<std::size_t>(segments, 2); }

// A raw message must be exactly what the receiver expects.
void expect_floats(std::size_t received, std::size_t count, int rank) {
  if (received != 4 * count)
    GZ_THROW(PayloadError, "rank ", rank, " sent ", received, " bytes for a segment of ", count,
             " floats (the ranks disagree on the call)");
}

}  // namespace

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
      ws.payloads_.push_back(
          {slots.at(set, i), i == m ? own_bytes : payload_size(slots.at(set, i), received[i], cap, *w.codec, count)});
    w.codec->decode_sum(ws.payloads_, target, count, scale_by, exec);
  }
  timer.end(&stats.decode_s);
}

Wire Run::flat_wire(Algorithm a, int members, std::size_t unit_count) {
  // allgather encodes the whole run; scatter_reduce its chunks, the first the largest.
  return a == Algorithm::Allgather ? wire_for(unit_count, false)
                                   : wire_for(chunk_range(unit_count, members, 0).count, true);
}

std::size_t Run::flat_segments(Algorithm a, int members, std::size_t count, std::size_t seg) {
  return segment_count(a == Algorithm::Allgather ? count : chunk_range(count, members, 0).count, seg);
}

void Run::flat(Algorithm a, const Group& g, float* buf, float* residual, float* server, std::size_t count,
               float scale_by, Carve& wire_carve, Carve& local, Slots* keep, std::size_t unit_count) {
  const Wire w = flat_wire(a, g.size(), unit_count ? unit_count : count);
  if (a == Algorithm::Allgather)
    allgather(g, buf, residual, count, scale_by, w, wire_carve, keep);
  else
    scatter_reduce(g, buf, residual, server, count, scale_by, w, wire_carve, local,
                   a == Algorithm::ReduceScatter ? Half::ReduceOnly : Half::Both, keep);
}

std::size_t Run::kept_size(const Codec& c, const std::byte* slot, std::size_t count, std::size_t cap) const {
  if (!payload_size_varies(c)) return c.max_payload_bytes(count);  // fixed-size payloads
  std::byte head[wire::kHeaderBytes];  // the sender's header says
  mem::to_host(head, slot, sizeof head, o.device, o.stream);
  std::uint64_t body = 0;
  std::memcpy(&body, head + 24, sizeof body);
  return body <= cap - wire::kHeaderBytes ? wire::kHeaderBytes + body : cap;
}

void Run::decode_kept(Algorithm a, int members, const Wire& w, const Slots& kept, std::size_t count, float* buf,
                      float scale_by) {
  const auto N = static_cast<std::size_t>(members);
  Codec& kc = *w.kept(a);
  const std::size_t cap = kc.max_payload_bytes(w.seg);
  const std::size_t S = flat_segments(a, members, count, w.seg);
  timer.begin();
  for (std::size_t s = 0; s < S; ++s) {
    if (a == Algorithm::Allgather) {  // allgather's sum of every member's payload
      const ChunkRange r = segment(count, w.seg, s);
      ws.payloads_.clear();
      for (std::size_t j = 0; j < N; ++j) ws.payloads_.push_back({kept.at(s, j), kept_size(kc, kept.at(s, j), r.count, cap)});
      kc.decode_sum(ws.payloads_, buf + r.offset, r.count, scale_by, exec);
    } else {  // scatter_reduce's gather: each chunk's payload into its place
      for (std::size_t j = 0; j < N; ++j) {
        const ChunkRange c = chunk_range(count, members, static_cast<int>(j)), r = segment(c.count, w.seg, s);
        const PayloadRef p{kept.at(s, j), kept_size(kc, kept.at(s, j), r.count, cap)};
        kc.decode_sum(std::span(&p, 1), buf + c.offset + r.offset, r.count, scale_by, exec);
      }
    }
  }
  timer.end(&stats.decode_s);
}

// allgather
//
// Segment s of the buffer: this member encodes it (worker EF) into its own
// slot and sends that payload to every other member, receiving theirs into
// their slots; then all P payloads are summed into the segment in member
// order (decode_sum: the first overwrites, the last scales), the same
// additions in the same order on every rank, so every rank gets the same
// bits. Raw (fp32 on the host): the segment itself is sent and the received
// floats summed with it in place. Traffic per rank: (P-1) payloads.
void Run::allgather(const Group& g, float* buf, float* residual, std::size_t count, float scale_by, Wire w,
                    Carve& wire_carve, Slots* keep) {
  const auto Pg = static_cast<std::size_t>(g.size()), m = static_cast<std::size_t>(g.me);
  const std::size_t S = segment_count(count, w.seg);
  const std::size_t cap = w.raw ? 4 * w.seg : w.codec->max_payload_bytes(w.seg);
  // Two slot sets reused by parity; or, to keep them, one per segment.
  const Slots slots(wire_carve, keep ? S : sets_for(S), Pg, cap);
  if (keep) *keep = slots;
  auto set_of = [&](std::size_t s) { return keep ? s : s % 2; };
  stats.segments = std::max(stats.segments, S);
  if (wire_carve.sizing()) return;

  auto received = [&](std::size_t k, std::size_t i) -> std::size_t& { return ws.received_[k * Pg + i]; };
  Flight flights[2];
  auto post = [&](std::size_t s) {
    const std::size_t k = s % 2, set = set_of(s);
    const ChunkRange r = segment(count, w.seg, s);
    ConstSlice out{buf + r.offset, 4 * r.count};
    if (!w.raw) {
      timer.begin();
      const std::size_t bytes = w.codec->encode(buf + r.offset, residual ? residual + r.offset : nullptr, r.count,
                                                slots.at(set, m), cap, exec);
      timer.end(&stats.encode_s);
      received(k, m) = bytes;
      out = ConstSlice{slots.at(set, m), send_size(bytes, *w.codec, r.count)};
      before_send();
    }
    ws.sends_.clear();
    ws.recvs_.clear();
    for (std::size_t i = 0; i < Pg; ++i) {
      if (i == m) continue;
      ws.sends_.push_back({g.ranks[i], out});
      // Raw floats: receive exactly the segment, as a transport without
      // exact sizes (torch's process group, NCCL) needs sends and receives
      // of one size.
      ws.recvs_.push_back(
          {g.ranks[i], Slice{slots.at(set, i), w.raw ? 4 * r.count : recv_size(*w.codec, r.count, cap)}, &received(k, i)});
    }
    flights[k] = start(ws.sends_, ws.recvs_);
  };
  auto finish_segment = [&](std::size_t s) {
    const std::size_t k = s % 2;
    const ChunkRange r = segment(count, w.seg, s);
    finish(flights[k]);
    sum_segment(g, w, slots, set_of(s), &received(k, 0), buf + r.offset, received(k, m), r.count, cap, scale_by,
                buf + r.offset);
  };

  try {
    if (S > 0) post(0);
    for (std::size_t s = 0; s < S; ++s) {
      if (s + 1 < S) post(s + 1);
      finish_segment(s);
    }
    check_decodes();
  } catch (...) {
    abort_flights(flights, "allgather failed on this rank");
    throw;
  }
}

// scatter_reduce (two-phase compressed allreduce, as in DeepSpeed)
//
// The buffer is split into P chunks (chunk_range: sizes differ by at most
// one, some may be empty); member j owns chunk j. Every chunk is cut into
// segments of the same length, and segment s of every chunk moves together:
//   1. scatter: segment s of chunk j is encoded (worker EF) and sent to
//      member j; this member receives every member's payload of its own
//      chunk's segment s (slot area B; the own one is encoded there too).
//   2. reduce: those P payloads are summed in member order into the chunk
//      sum, which is encoded again, with the server codec (w.server:
//      fp16 for onebit, else the codec itself; server_codec_config) and the
//      server EF, and sent to every member (area G).
//   3. gather: every member's payload of segment s of its chunk is decoded
//      into the buffer (overwrite, scaled); the owner too decodes its own
//      payload rather than keep its exact sum, so every rank gets the same
//      bits.
// Three stages, two segments in flight: scatter(s+1) and gather(s) run while
// reduce and decode work. Traffic per rank: (P-1)/P payloads of the codec
// plus (P-1)/P of the server codec (2(P-1)/P payloads when they are one).
//
// Raw (fp32 on the host): the same exchanges without payloads: chunks are
// sent from the buffer, the owner sums the received floats into its chunk
// in place (scaled: no second rounding), sends the sum from there, and the
// other chunks are received straight into the buffer. With this, none is
// reduce-scatter + allgather with one pass over the owner's chunk.
//
// Half::ReduceOnly stops after step 2's sum (written into the buffer's own
// chunk, scaled); Half::GatherOnly starts at step 2's send of the buffer's
// own chunk. Hierarchical runs them apart, inside a node.
void Run::scatter_reduce(const Group& g, float* buf, float* residual, float* server, std::size_t count,
                         float scale_by, Wire w, Carve& wire_carve, Carve& local, Half half, Slots* keep) {
  const auto Pg = static_cast<std::size_t>(g.size()), m = static_cast<std::size_t>(g.me);
  auto chunk = [&](std::size_t j) { return chunk_range(count, g.size(), static_cast<int>(j)); };
  const ChunkRange own = chunk(m);
  const std::size_t S = segment_count(chunk(0).count, w.seg);  // chunk 0 is the largest
  const std::size_t cap = w.raw ? 4 * w.seg : w.codec->max_payload_bytes(w.seg), sets = sets_for(S);
  const std::size_t cap_g = w.raw ? cap : w.server->max_payload_bytes(w.seg);  // the chunk sums' payloads
  const bool scatter = half != Half::GatherOnly, gather = half != Half::ReduceOnly;
  // Raw needs room only for what it receives into a slot: the scatter's payloads.
  const Slots A(wire_carve, w.raw || !scatter ? 0 : sets, Pg, cap);
  const Slots B(wire_carve, scatter ? sets : 0, Pg, cap);
  // The gather's slots: two sets reused by parity; or, to keep them, one per segment.
  const Slots G(wire_carve, w.raw || !gather ? 0 : keep ? S : sets, Pg, cap_g);
  if (keep) *keep = G;
  auto gset = [&](std::size_t s) { return keep ? s : s % 2; };
  float* sums = w.raw || half != Half::Both ? nullptr : local.add<float>(sets * w.seg);
  stats.segments = std::max(stats.segments, S);
  if (wire_carve.sizing()) return;

  // Received bytes: rows 0, 1 for the scatter of each set, rows 2, 3 for the
  // gather (both may be in flight at once).
  auto received = [&](std::size_t row, std::size_t i) -> std::size_t& { return ws.received_[row * Pg + i]; };
  std::size_t own_bytes[2] = {0, 0};  // this member's payload in B, per set
  Flight flights[4];                  // scatter: 0, 1; gather: 2, 3
  auto seg_of = [&](std::size_t j, std::size_t s) {  // segment s of chunk j, in buffer offsets
    const ChunkRange c = chunk(j), r = segment(c.count, w.seg, s);
    return ChunkRange{c.offset + r.offset, r.count};
  };

  // 1. scatter
  auto scatter_step = [&](std::size_t s) {
    if (!scatter) return;
    const std::size_t k = s % 2;
    ws.sends_.clear();
    ws.recvs_.clear();
    for (std::size_t j = 0; j < Pg; ++j) {
      const ChunkRange r = seg_of(j, s);
      ConstSlice out{buf + r.offset, 4 * r.count};
      if (!w.raw) {
        std::byte* dst = j == m ? B.at(k, m) : A.at(k, j);
        timer.begin();
        const std::size_t bytes =
            w.codec->encode(buf + r.offset, residual ? residual + r.offset : nullptr, r.count, dst, cap, exec);
        timer.end(&stats.encode_s);
        if (j == m) own_bytes[k] = bytes;
        out = ConstSlice{dst, send_size(bytes, *w.codec, r.count)};
        for (Flight& f : flights) poke(f);  // what is in flight keeps moving
      }
      if (j == m) continue;
      ws.sends_.push_back({g.ranks[j], out});
      // Raw floats: exactly this member's own segment (see allgather).
      const std::size_t mine = seg_of(m, s).count;
      ws.recvs_.push_back(
          {g.ranks[j], Slice{B.at(k, j), w.raw ? 4 * mine : recv_size(*w.codec, mine, cap)}, &received(k, j)});
    }
    if (!w.raw) before_send();
    flights[k] = start(ws.sends_, ws.recvs_);
  };

  // 2. reduce (and send the chunk's sum)
  auto reduce_step = [&](std::size_t s) {
    const std::size_t k = s % 2;
    const ChunkRange r = seg_of(m, s);
    if (scatter) {
      finish(flights[k]);
      // Into the chunk sum to compress again, or (raw, or a half) the
      // buffer's own chunk, scaled: no second rounding.
      const bool again = half == Half::Both && !w.raw;
      sum_segment(g, w, B, k, &received(k, 0), buf + r.offset, own_bytes[k], r.count, cap, again ? 1.0f : scale_by,
                  again ? sums + k * w.seg : buf + r.offset);
    }
    if (!gather) return;
    ConstSlice out{buf + r.offset, 4 * r.count};
    if (!w.raw) {
      if (half == Half::Both) check_decodes();  // never send on a sum of a rejected payload
      const float* from = half == Half::Both ? sums + k * w.seg : buf + r.offset;
      float* ef = half == Half::Both && server ? server + (r.offset - own.offset) : nullptr;
      timer.begin();
      const std::size_t bytes = w.server->encode(from, ef, r.count, G.at(gset(s), m), cap_g, exec);
      timer.end(&stats.encode_s);
      received(2 + k, m) = bytes;
      out = ConstSlice{G.at(gset(s), m), send_size(bytes, *w.server, r.count)};
      before_send();
    }
    ws.sends_.clear();
    ws.recvs_.clear();
    for (std::size_t j = 0; j < Pg; ++j) {
      if (j == m) continue;
      const ChunkRange rj = seg_of(j, s);
      ws.sends_.push_back({g.ranks[j], out});
      ws.recvs_.push_back({g.ranks[j],
                           w.raw ? Slice{buf + rj.offset, 4 * rj.count}
                                 : Slice{G.at(gset(s), j), recv_size(*w.server, rj.count, cap_g)},
                           &received(2 + k, j)});
    }
    flights[2 + k] = start(ws.sends_, ws.recvs_);
  };

  // 3. gather
  auto gather_step = [&](std::size_t s) {
    if (!gather) return;
    const std::size_t k = s % 2;
    finish(flights[2 + k]);
    if (w.raw) {
      for (std::size_t j = 0; j < Pg; ++j)
        if (j != m) expect_floats(received(2 + k, j), seg_of(j, s).count, g.ranks[j]);
      return;
    }
    timer.begin();
    for (std::size_t j = 0; j < Pg; ++j) {
      const ChunkRange r = seg_of(j, s);
      std::byte* slot = G.at(gset(s), j);
      const PayloadRef p{slot, j == m ? received(2 + k, m) : payload_size(slot, received(2 + k, j), cap_g, *w.server, r.count)};
      w.server->decode_sum(std::span(&p, 1), buf + r.offset, r.count, scale_by, exec);  // overwrite, scaled
    }
    timer.end(&stats.decode_s);
  };

  try {
    if (S > 0) scatter_step(0);
    for (std::size_t s = 0; s < S; ++s) {
      if (s + 1 < S) scatter_step(s + 1);
      reduce_step(s);
      if (s >= 1) gather_step(s - 1);
    }
    if (S > 0) gather_step(S - 1);
    check_decodes();
  } catch (...) {
    abort_flights(flights, "scatter_reduce failed on this rank");
    throw;
  }
}

}  // namespace gz::detail

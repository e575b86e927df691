// CPU top-k by magnitude: radix select over the bits of |v| (kernels/topk.h).
//
// Words used below:
//   - key: the 31-bit magnitude key of an element (topk_key).
//   - sample: kSample elements at fixed, evenly spaced positions. Their keys
//     give a lower bound L that, with high probability, at least k and not
//     many more than k keys reach.
//   - candidates: the (index, value) pairs, indices increasing, of the elements
//     whose key >= L, found in one streaming pass that also applies error
//     feedback (r = g + r). Later passes read these two arrays sequentially.
// The exact answer is then a radix select over the candidates only. When the
// bound misses (fewer than k candidates, or more than fit), the select runs
// over the whole array instead: the result never depends on the sample, only
// the speed does.
//
// The candidate pass and the emit work a cache line (16 floats) at a time
// through kernels/topk_lines_cpu.h, which holds the AVX-512, AVX2 and
// portable versions of the few line operations; the build picks one at
// compile time. Nothing else here depends on the instruction set.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <type_traits>

#include "common/error.h"
#include "common/workspace.h"
#include "kernels/cpu.h"
#include "kernels/error_feedback.h"
#include "kernels/cpu_loops.h"
#include "kernels/topk_lines_cpu.h"

namespace gz::kernels::cpu {
namespace {

using detail::input;
using detail::kPrefetchAhead;
constexpr std::size_t kSample = kTopkSample;  // sampling policy: kernels/topk.h, shared with the CUDA twin
constexpr std::size_t kLine = topk_line::kWidth;  // 16 floats: one cache line

std::size_t candidate_capacity(std::size_t n, std::size_t k) { return topk_candidate_capacity(n, k); }

struct Workspace {
  std::uint32_t* cand_idx;
  float* cand_val;
  std::uint32_t* cand_keys;  // radix scratch
  std::size_t capacity;
  std::uint32_t* sample;
};

// Same sequence of carves for sizing and for use.
std::size_t carve(void* ws, std::size_t ws_bytes, std::size_t n, std::size_t k, Workspace* out) {
  WorkspaceCarver c(ws, ws_bytes);
  const std::size_t cap = candidate_capacity(n, k);
  std::uint32_t* cand_idx = c.add<std::uint32_t>(cap);
  float* cand_val = c.add<float>(cap);
  std::uint32_t* cand_keys = c.add<std::uint32_t>(cap);
  std::uint32_t* sample = c.add<std::uint32_t>(kSample);
  c.check();
  if (out) *out = {cand_idx, cand_val, cand_keys, cap, sample};
  return c.bytes();
}

// Picks the bin of histogram `hist` (bins-1 down to 0) holding the
// `remaining`-th largest key; lowers `remaining` by the count above it.
std::uint32_t pick_bin(const std::uint32_t* hist, std::uint32_t bins, std::uint64_t& remaining) {
  std::uint64_t above = 0;
  std::uint32_t b = bins - 1;
  for (; b > 0; --b) {
    if (above + hist[b] >= remaining) break;
    above += hist[b];
  }
  remaining -= above;
  return b;
}

// Threshold and tie count of the k largest keys among key_at(0..count),
// 1 <= k <= count: one histogram pass per digit, each over the keys that
// share the digits chosen so far. Without scratch, later passes filter the
// whole input; with scratch (count keys), they run over a compacted copy of
// the matching keys only, which after the first digit is a small fraction.
template <class KeyAt>
TopkThreshold radix_threshold(KeyAt key_at, std::size_t count, std::size_t k, std::uint32_t* scratch = nullptr) {
  std::uint32_t prefix = 0, prefix_mask = 0;
  std::uint64_t remaining = k;
  std::array<std::uint32_t, 1u << 11> hist;
  std::size_t live = count;  // keys in scratch, once compacted
  for (int d = 0; d < kTopkDigits; ++d) {
    const std::uint32_t bins = 1u << kTopkDigitBits[d];
    std::fill_n(hist.begin(), bins, 0u);
    if (d == 0) {
      for (std::size_t j = 0; j < count; ++j) ++hist[topk_digit(key_at(j), d)];
    } else if (scratch) {
      for (std::size_t j = 0; j < live; ++j) ++hist[topk_digit(scratch[j], d)];
    } else {
      for (std::size_t j = 0; j < count; ++j) {
        const std::uint32_t key = key_at(j);
        if ((key & prefix_mask) == prefix) ++hist[topk_digit(key, d)];
      }
    }
    const std::uint32_t b = pick_bin(hist.data(), bins, remaining);
    prefix |= b << kTopkDigitShift[d];
    prefix_mask |= (bins - 1) << kTopkDigitShift[d];
    if (scratch && d + 1 < kTopkDigits) {  // keep only the keys in bin b (branch-free)
      std::size_t m = 0;
      if (d == 0) {
        for (std::size_t j = 0; j < count; ++j) {
          const std::uint32_t key = key_at(j);
          scratch[m] = key;
          m += (key & prefix_mask) == prefix;
        }
      } else {
        for (std::size_t j = 0; j < live; ++j) {
          scratch[m] = scratch[j];
          m += (scratch[j] & prefix_mask) == prefix;
        }
      }
      live = m;
    }
  }
  return {prefix, remaining};
}

// Where an emit stands: entries written, ties at the threshold still to send.
struct EmitCursor {
  std::size_t out = 0;
  std::uint64_t ties = 0;
};

// Writes, in order, every element (index_at(j), value_at(j)), j in
// [begin, end), above the threshold plus the first e.ties equal to it.
template <class IndexAt, class ValueAt>
void emit_range(IndexAt index_at, ValueAt value_at, std::size_t begin, std::size_t end, std::uint32_t threshold,
                EmitCursor& e, std::uint32_t* idx, float* val) {
  for (std::size_t j = begin; j < end; ++j) {
    const float v = value_at(j);
    const std::uint32_t key = topk_key(v);
    if (key < threshold || (key == threshold && e.ties == 0)) continue;
    if (key == threshold) --e.ties;
    idx[e.out] = static_cast<std::uint32_t>(index_at(j));
    val[e.out] = v;
    ++e.out;
  }
}

// Error feedback for the `count` entries sent: their residual becomes
// ef_residual(v, v) (+0 for every v, inf and NaN included). Returns count.
template <bool kEf>
std::size_t sent(float* r, const std::uint32_t* idx, const float* val, std::size_t count) {
  if constexpr (kEf)
    for (std::size_t j = 0; j < count; ++j) r[idx[j]] = ef_residual(val[j], val[j]);
  return count;
}

// emit_range over all `count`; returns the count written.
template <bool kEf, class IndexAt, class ValueAt>
std::size_t emit(IndexAt index_at, ValueAt value_at, std::size_t count, float* r, TopkThreshold t,
                 std::uint32_t* idx, float* val) {
  EmitCursor e{0, t.ties};
  emit_range(index_at, value_at, 0, count, t.threshold, e, idx, val);
  return sent<kEf>(r, idx, val, e.out);
}

// emit over the candidate arrays, which writes exactly `room` entries. A
// line with no key equal to the threshold (nearly all) is one compare and
// a compress (kernels/topk_lines_cpu.h); the scalar loop's unpredictable
// branch cost ~3 ns per candidate. Lines holding a tie, and the last lines,
// where a full-width store would pass the end of idx/val, go in order, one
// by one.
template <bool kEf>
std::size_t emit_candidates(const Workspace& ws, std::size_t count, float* r, TopkThreshold t, std::size_t room,
                            std::uint32_t* idx, float* val) {
  namespace line = topk_line;
  auto index_at = [&](std::size_t j) { return ws.cand_idx[j]; };
  auto value_at = [&](std::size_t j) { return ws.cand_val[j]; };
  EmitCursor e{0, t.ties};
  std::size_t j = 0;
  for (; j + line::kWidth <= count; j += line::kWidth) {
    const line::Values v = line::load(ws.cand_val + j);
    const line::Words key = line::keys(v);
    if (line::mask_eq(key, t.threshold) != 0 || e.out + line::kWidth > room) {
      emit_range(index_at, value_at, j, j + line::kWidth, t.threshold, e, idx, val);
      continue;
    }
    const std::uint32_t above = line::mask_gt(key, t.threshold);
    line::compress_store(above, line::load(ws.cand_idx + j), v, idx + e.out, val + e.out);
    e.out += line::popcount(above);
  }
  emit_range(index_at, value_at, j, count, t.threshold, e, idx, val);
  return sent<kEf>(r, idx, val, e.out);
}

// Appends (index, value) pairs to a bounded list; counts past its end.
struct CandidateList {
  std::uint32_t* idx;
  float* val;
  std::size_t capacity;
  std::size_t count = 0;

  // The elements base + b of values[] for the bits b set in mask.
  void push(std::uint32_t mask, std::size_t base, const float* values) {
    while (mask) {
      const std::size_t i = base + static_cast<std::size_t>(std::countr_zero(mask));
      if (count < capacity) {
        idx[count] = static_cast<std::uint32_t>(i);
        val[count] = values[i];
      }
      ++count;
      mask &= mask - 1;
    }
  }
};

// Where v lives once EF has been applied: r with EF, g itself without (then
// a float gradient: see encode_entry).
template <bool kEf, class G>
const float* values_of(const G* g, const float* r) {
  if constexpr (kEf)
    return r;
  else
    return g;
}

// Lists the elements i..i+count (count < kLine) of v whose key reaches
// `bound`, where v = g, or with EF v = g + r, stored back to r.
template <bool kEf, class G>
void scan_tail(const G* g, float* r, std::size_t i, std::size_t count, std::uint32_t bound, CandidateList& list) {
  std::uint32_t mask = 0;
  for (std::size_t b = 0; b < count; ++b) {
    const float v = input<kEf>(g, r, i + b);
    if constexpr (kEf) r[i + b] = v;
    mask |= static_cast<std::uint32_t>(topk_key(v) >= bound) << b;
  }
  list.push(mask, i, values_of<kEf>(g, r));
}

// scan_tail over one full line, i..i+kLine: a compare into a bit mask and an
// in-register compress (kernels/topk_lines_cpu.h); a portable loop's mask
// reduction and branchy push are a large share of this memory-bound pass
// on one core.
template <bool kEf, class G>
[[gnu::always_inline]] inline void scan_line(const G* g, float* r, std::size_t i, std::uint32_t bound,
                                             CandidateList& list) {
  namespace line = topk_line;
  line::Values v = line::load(g + i);  // widened (topk_lines_cpu.h)
  if constexpr (kEf) {
    v = line::add(v, line::load(r + i));
    line::store(r + i, v);
  }
  const std::uint32_t m = line::mask_ge(line::keys(v), bound);
  if (m == 0) return;
  if (list.count + line::kWidth <= list.capacity) {
    line::compress_store(m, line::iota(static_cast<std::uint32_t>(i)), v, list.idx + list.count,
                         list.val + list.count);
    list.count += line::popcount(m);
  } else {
    list.push(m, i, values_of<kEf>(g, r));
  }
}

// Lists the elements of v[begin..end) with key >= bound into `list`
// (applying EF on the way when kEf).
template <bool kEf, class G>
void scan_candidates(const G* g, float* r, std::size_t begin, std::size_t end, std::uint32_t bound,
                     CandidateList& list) {
  std::size_t i = begin;
  for (; i + kLine <= end; i += kLine) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead);
    scan_line<kEf>(g, r, i, bound, list);
  }
  scan_tail<kEf>(g, r, i, end - i, bound, list);
}

// One pass: applies EF (r = g + r) and lists the elements with key >= bound
// in ws.cand_idx/cand_val, indices increasing. Returns how many there are;
// they are all stored only when that is at most ws.capacity.
//
// One core reading one stream gets about half the memory bandwidth it gets
// reading several: the pass walks kStreams equal chunks in lockstep, each
// listing into its own slice of the candidate arrays, then closes the gaps.
// A chunk with more candidates than its slice (skewed data) costs one more
// sequential pass over v, not the fall back to the whole-array select.
// The streams are unrolled so that each list's count stays in a register.
// (AMD EPYC, AVX2, 16M: unrolling ~7.0 -> ~6.1 ms; 2 KiB ahead per stream
// instead of 1 KiB ~6.4 -> ~6.0 ms; 8 streams ~6.9 ms; min of 60 calls.)
template <bool kEf, class G>
std::size_t find_candidates(const G* g, float* r, std::size_t n, std::uint32_t bound, const Workspace& ws) {
  constexpr std::size_t kStreams = 4;
  constexpr std::size_t kStreamAhead = 512;  // elements prefetched ahead in each stream (8 KiB in all)
  const std::size_t chunk = n / kStreams / kLine * kLine;
  const std::size_t slice = ws.capacity / kStreams;
  std::array<CandidateList, kStreams> lists;
  for (std::size_t s = 0; s < kStreams; ++s) lists[s] = {ws.cand_idx + s * slice, ws.cand_val + s * slice, slice};
  const float* values = values_of<kEf>(g, r);
  for (std::size_t j = 0; j < chunk; j += kLine) {
#pragma GCC unroll 4
    for (std::size_t s = 0; s < kStreams; ++s) {
      const std::size_t i = s * chunk + j;
      __builtin_prefetch(g + i + kStreamAhead);
      if constexpr (kEf) __builtin_prefetch(r + i + kStreamAhead);
      scan_line<kEf>(g, r, i, bound, lists[s]);
    }
  }
  // The tail after the last chunk belongs to the last list (its indices are the largest).
  scan_candidates<kEf>(g, r, kStreams * chunk, n, bound, lists[kStreams - 1]);

  std::size_t total = 0;
  bool overflow = false;
  for (const CandidateList& l : lists) {
    total += l.count;
    overflow |= l.count > l.capacity;
  }
  if (total > ws.capacity) return total;  // the caller falls back to the whole array
  if (overflow) {  // EF is applied: v is final, list it again in one run
    CandidateList all{ws.cand_idx, ws.cand_val, ws.capacity};
    scan_candidates<false>(values, nullptr, 0, n, bound, all);
    return all.count;
  }
  std::size_t out = lists[0].count;
  for (std::size_t s = 1; s < kStreams; ++s) {  // out <= s * slice: moves go left or stay
    std::copy_n(lists[s].idx, lists[s].count, ws.cand_idx + out);
    std::copy_n(lists[s].val, lists[s].count, ws.cand_val + out);
    out += lists[s].count;
  }
  return out;
}

// The key that about `rank` of the kSample sampled keys reach.
template <bool kEf, class G>
std::uint32_t sample_bound(const G* g, const float* r, std::size_t n, std::size_t rank, std::uint32_t* sample) {
  constexpr std::size_t kAhead = 16;  // scattered reads: keep several misses in flight
  for (std::size_t j = 0; j < kSample; ++j) {
    const std::size_t i = topk_sample_position(j, n), ahead = topk_sample_position(j + kAhead, n);
    if (ahead < n) {
      __builtin_prefetch(g + ahead);
      if constexpr (kEf) __builtin_prefetch(r + ahead);
    }
    sample[j] = topk_key(input<kEf>(g, r, i));
  }
  // The sample is not needed afterwards: it is its own radix scratch.
  return radix_threshold([&](std::size_t j) { return sample[j]; }, kSample, rank, sample).threshold;
}

template <bool kEf, class G>
std::size_t select_all(const G* g, float* r, std::size_t n, std::uint32_t* idx, float* val) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = input<kEf>(g, r, i);
    idx[i] = static_cast<std::uint32_t>(i);
    val[i] = v;
    if constexpr (kEf) r[i] = ef_residual(v, v);
  }
  return n;
}

// Exact selection over the whole array; with EF, r already holds v.
template <bool kEf>
std::size_t select_direct(const float* v, float* r, std::size_t n, std::size_t k, std::uint32_t* idx, float* val) {
  const TopkThreshold t = radix_threshold([&](std::size_t i) { return topk_key(v[i]); }, n, k);
  return emit<kEf>([](std::size_t i) { return i; }, [&](std::size_t i) { return v[i]; }, n, r, t, idx, val);
}

template <bool kEf, class G>
std::size_t encode(const Workspace& ws, const G* g, float* r, std::size_t n, std::size_t k, bool sampled,
                   std::uint32_t* idx, float* val) {
  if (k >= n) return select_all<kEf>(g, r, n, idx, val);
  const float* v = values_of<kEf>(g, r);  // where v lives once EF has been applied
  const std::uint64_t rank = topk_sample_rank(n, k, sampled);  // 0: no sample (k == 0, small n)
  if (rank == 0) {
    if constexpr (kEf)
      for (std::size_t i = 0; i < n; ++i) r[i] = input<true>(g, r, i);
    return k == 0 ? 0 : select_direct<kEf>(v, r, n, k, idx, val);
  }
  const std::uint32_t bound = sample_bound<kEf>(g, r, n, static_cast<std::size_t>(rank), ws.sample);
  const std::size_t c = find_candidates<kEf>(g, r, n, bound, ws);
  if (sampled && c >= topk_sampled_min(k) && c <= topk_sampled_max(k) && c <= ws.capacity)
    return emit_candidates<kEf>(ws, c, r, TopkThreshold{0, ~std::uint64_t{0}}, c, idx, val);  // all of them
  if (c < k || c > ws.capacity) return select_direct<kEf>(v, r, n, k, idx, val);
  const TopkThreshold t =
      radix_threshold([&](std::size_t j) { return topk_key(ws.cand_val[j]); }, c, k, ws.cand_keys);
  return emit_candidates<kEf>(ws, c, r, t, k, idx, val);
}

template <class G>
std::size_t encode_entry(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n, std::size_t k,
                         bool sampled, std::uint32_t* idx, float* val) {
  if (!ws) {
    ws_bytes = carve(nullptr, 0, n, k, nullptr);
    return 0;
  }
  Workspace w;
  carve(ws, ws_bytes, n, k, &w);
  k = std::min(k, n);
  if constexpr (std::is_same_v<G, float>) {
    if (!r) return encode<false>(w, g, r, n, k, sampled, idx, val);
  } else {
    // Without EF v is g itself, and the selection reads v as float: the codec
    // widens a 16-bit gradient first (compressors/topk.cc).
    GZ_ENFORCE(r != nullptr, "topk: a 16-bit gradient needs a residual here");
  }
  return encode<true>(w, g, r, n, k, sampled, idx, val);
}

}  // namespace

template <class G>
std::size_t topk_encode(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n, std::size_t k,
                        std::uint32_t* idx, float* val) {
  return encode_entry(ws, ws_bytes, g, r, n, k, false, idx, val);
}

template <class G>
std::size_t topk_encode_sampled(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n,
                                std::size_t k, std::uint32_t* idx, float* val) {
  return encode_entry(ws, ws_bytes, g, r, n, k, true, idx, val);
}

#define GZ_INSTANTIATE(G)                                                                                      \
  template std::size_t topk_encode(void*, std::size_t&, const G*, float*, std::size_t, std::size_t, std::uint32_t*, \
                                   float*);                                                                      \
  template std::size_t topk_encode_sampled(void*, std::size_t&, const G*, float*, std::size_t, std::size_t,      \
                                           std::uint32_t*, float*);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

void topk_decode(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t begin, std::size_t end,
                 float* out, Combine c) {
  if (begin >= end) return;
  // The entries inside [begin, end): indices are strictly increasing.
  const std::size_t j0 = static_cast<std::size_t>(std::lower_bound(idx, idx + k, begin) - idx);
  const std::size_t j1 = static_cast<std::size_t>(std::lower_bound(idx + j0, idx + k, end) - idx);
  if (!c.accumulate) {
    std::fill(out, out + (end - begin), apply_scale(0.0f, c));
    with_combine(c, [&](auto acc, auto scaled) {
      for (std::size_t j = j0; j < j1; ++j) out[idx[j] - begin] = combine<acc, scaled>(0.0f, val[j], c.scale);
    });
    return;
  }
  for (std::size_t j = j0; j < j1; ++j) out[idx[j] - begin] += val[j];
  if (c.scaled())  // the elements the payload does not name are scaled too
    for (std::size_t i = 0; i < end - begin; ++i) out[i] *= c.scale;
}

}  // namespace gz::kernels::cpu

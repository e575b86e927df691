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
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/workspace.h"
#include "kernels/cpu.h"
#include "kernels/error_feedback.h"

namespace gz::kernels::cpu {
namespace {

constexpr std::size_t kSample = kTopkSample;  // sampling policy: kernels/topk.h, shared with the CUDA twin
constexpr std::size_t kPrefetchAhead = 1024;  // elements

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
// [begin, end), above the threshold plus the first e.ties equal to it;
// zeroes their residual.
template <bool kEf, class IndexAt, class ValueAt>
void emit_range(IndexAt index_at, ValueAt value_at, std::size_t begin, std::size_t end, float* r,
                std::uint32_t threshold, EmitCursor& e, std::uint32_t* idx, float* val) {
  for (std::size_t j = begin; j < end; ++j) {
    const float v = value_at(j);
    const std::uint32_t key = topk_key(v);
    if (key < threshold || (key == threshold && e.ties == 0)) continue;
    if (key == threshold) --e.ties;
    const std::size_t i = index_at(j);
    idx[e.out] = static_cast<std::uint32_t>(i);
    val[e.out] = v;
    if constexpr (kEf) r[i] = ef_residual(v, v);
    ++e.out;
  }
}

// emit_range over all `count`; returns the count written.
template <bool kEf, class IndexAt, class ValueAt>
std::size_t emit(IndexAt index_at, ValueAt value_at, std::size_t count, float* r, TopkThreshold t,
                 std::uint32_t* idx, float* val) {
  EmitCursor e{0, t.ties};
  emit_range<kEf>(index_at, value_at, 0, count, r, t.threshold, e, idx, val);
  return e.out;
}

// emit over the candidate arrays. With AVX-512, a block of 16 with no key
// equal to the threshold (nearly all) is one compare and two
// compress-stores; the scalar loop's unpredictable branch cost ~3 ns per
// candidate.
template <bool kEf>
std::size_t emit_candidates(const Workspace& ws, std::size_t count, float* r, TopkThreshold t, std::uint32_t* idx,
                            float* val) {
  auto index_at = [&](std::size_t j) { return static_cast<std::size_t>(ws.cand_idx[j]); };
  auto value_at = [&](std::size_t j) { return ws.cand_val[j]; };
  EmitCursor e{0, t.ties};
  std::size_t j = 0;
#if defined(__AVX512F__)
  const __m512i threshold = _mm512_set1_epi32(static_cast<int>(t.threshold));
  for (; j + 16 <= count; j += 16) {
    const __m512 v = _mm512_loadu_ps(ws.cand_val + j);
    const __m512i key = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));  // topk_key
    if (_mm512_cmpeq_epu32_mask(key, threshold) != 0) {  // ties: in order, one by one
      emit_range<kEf>(index_at, value_at, j, j + 16, r, t.threshold, e, idx, val);
      continue;
    }
    const __mmask16 sent = _mm512_cmpgt_epu32_mask(key, threshold);
    const __m512i index = _mm512_loadu_si512(ws.cand_idx + j);
    _mm512_mask_compressstoreu_epi32(idx + e.out, sent, index);
    _mm512_mask_compressstoreu_ps(val + e.out, sent, v);
    if constexpr (kEf) {  // ef_residual(v, v) is +0 for every v, inf and NaN included
      _mm512_mask_i32scatter_ps(r, sent, index, _mm512_setzero_ps(), 4);
    }
    e.out += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(sent)));
  }
#endif
  emit_range<kEf>(index_at, value_at, j, count, r, t.threshold, e, idx, val);
  return e.out;
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

// Lists the elements i..i+count (count <= 32) of v whose key reaches
// `bound`, where v = g, or with EF v = g + r, stored back to r.
template <bool kEf>
void scan_tail(const float* g, float* r, std::size_t i, std::size_t count, std::uint32_t bound, CandidateList& list) {
  std::uint32_t mask = 0;
  for (std::size_t b = 0; b < count; ++b) {
    const float v = kEf ? g[i + b] + r[i + b] : g[i + b];
    if constexpr (kEf) r[i + b] = v;
    mask |= static_cast<std::uint32_t>(topk_key(v) >= bound) << b;
  }
  list.push(mask, i, kEf ? r : g);
}

// Lists the elements i..i+16 (one cache line) of v whose key reaches
// `bound`, where v = g, or with EF v = g + r, stored back to r.
template <bool kEf>
void scan16(const float* g, float* r, std::size_t i, std::uint32_t bound, CandidateList& list) {
#if defined(__AVX512F__)
  // Compares straight into a mask register and compresses the hits in
  // registers: the portable loop's horizontal mask reduction and its branchy
  // push are a large share of this memory-bound pass on one core.
  __m512 v = _mm512_loadu_ps(g + i);
  if constexpr (kEf) {
    v = _mm512_add_ps(v, _mm512_loadu_ps(r + i));
    _mm512_storeu_ps(r + i, v);
  }
  const __m512i key = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));  // topk_key
  const __mmask16 m = _mm512_cmpge_epu32_mask(key, _mm512_set1_epi32(static_cast<int>(bound)));
  if (m == 0) return;
  if (list.count + 16 <= list.capacity) {
    // A full 16-lane store after an in-register compress (the lanes past the
    // hits are overwritten later or ignored): a compress straight to memory
    // is several times slower on Intel cores.
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i index = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(i)));
    _mm512_storeu_si512(list.idx + list.count, _mm512_maskz_compress_epi32(m, index));
    _mm512_storeu_ps(list.val + list.count, _mm512_maskz_compress_ps(m, v));
    list.count += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(m)));
  } else {
    list.push(m, i, kEf ? r : g);
  }
#else
  scan_tail<kEf>(g, r, i, 16, bound, list);
#endif
}

// Lists the elements of v[begin..end) with key >= bound into `list`
// (applying EF on the way when kEf).
template <bool kEf>
void scan_candidates(const float* g, float* r, std::size_t begin, std::size_t end, std::uint32_t bound,
                     CandidateList& list) {
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __builtin_prefetch(g + i + kPrefetchAhead);
    if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead);
    scan16<kEf>(g, r, i, bound, list);
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
template <bool kEf>
std::size_t find_candidates(const float* g, float* r, std::size_t n, std::uint32_t bound, const Workspace& ws) {
  constexpr std::size_t kStreams = 4;
  const std::size_t chunk = n / kStreams / 16 * 16;
  const std::size_t slice = ws.capacity / kStreams;
  std::array<CandidateList, kStreams> lists;
  for (std::size_t s = 0; s < kStreams; ++s) lists[s] = {ws.cand_idx + s * slice, ws.cand_val + s * slice, slice};
  const float* values = kEf ? r : g;
  for (std::size_t j = 0; j < chunk; j += 16) {
    for (std::size_t s = 0; s < kStreams; ++s) {
      const std::size_t i = s * chunk + j;
      __builtin_prefetch(g + i + kPrefetchAhead / kStreams);
      if constexpr (kEf) __builtin_prefetch(r + i + kPrefetchAhead / kStreams);
      scan16<kEf>(g, r, i, bound, lists[s]);
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
template <bool kEf>
std::uint32_t sample_bound(const float* g, const float* r, std::size_t n, std::size_t rank, std::uint32_t* sample) {
  constexpr std::size_t kAhead = 16;  // scattered reads: keep several misses in flight
  for (std::size_t j = 0; j < kSample; ++j) {
    const std::size_t i = topk_sample_position(j, n), ahead = topk_sample_position(j + kAhead, n);
    if (ahead < n) {
      __builtin_prefetch(g + ahead);
      if constexpr (kEf) __builtin_prefetch(r + ahead);
    }
    sample[j] = topk_key(kEf ? g[i] + r[i] : g[i]);
  }
  // The sample is not needed afterwards: it is its own radix scratch.
  return radix_threshold([&](std::size_t j) { return sample[j]; }, kSample, rank, sample).threshold;
}

template <bool kEf>
std::size_t select_all(const float* g, float* r, std::size_t n, std::uint32_t* idx, float* val) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = kEf ? g[i] + r[i] : g[i];
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

template <bool kEf>
std::size_t encode(const Workspace& ws, const float* g, float* r, std::size_t n, std::size_t k, bool sampled,
                   std::uint32_t* idx, float* val) {
  if (k >= n) return select_all<kEf>(g, r, n, idx, val);
  const float* v = kEf ? r : g;  // where v lives once EF has been applied
  const std::uint64_t rank = topk_sample_rank(n, k, sampled);  // 0: no sample (k == 0, small n)
  if (rank == 0) {
    if constexpr (kEf)
      for (std::size_t i = 0; i < n; ++i) r[i] += g[i];
    return k == 0 ? 0 : select_direct<kEf>(v, r, n, k, idx, val);
  }
  const std::uint32_t bound = sample_bound<kEf>(g, r, n, static_cast<std::size_t>(rank), ws.sample);
  const std::size_t c = find_candidates<kEf>(g, r, n, bound, ws);
  if (sampled && c >= topk_sampled_min(k) && c <= topk_sampled_max(k) && c <= ws.capacity)
    return emit_candidates<kEf>(ws, c, r, TopkThreshold{0, ~std::uint64_t{0}}, idx, val);  // all of them
  if (c < k || c > ws.capacity) return select_direct<kEf>(v, r, n, k, idx, val);
  const TopkThreshold t =
      radix_threshold([&](std::size_t j) { return topk_key(ws.cand_val[j]); }, c, k, ws.cand_keys);
  return emit_candidates<kEf>(ws, c, r, t, idx, val);
}

std::size_t encode_entry(void* ws, std::size_t& ws_bytes, const float* g, float* r, std::size_t n, std::size_t k,
                         bool sampled, std::uint32_t* idx, float* val) {
  if (!ws) {
    ws_bytes = carve(nullptr, 0, n, k, nullptr);
    return 0;
  }
  Workspace w;
  carve(ws, ws_bytes, n, k, &w);
  k = std::min(k, n);
  return r ? encode<true>(w, g, r, n, k, sampled, idx, val) : encode<false>(w, g, r, n, k, sampled, idx, val);
}

}  // namespace

std::size_t topk_encode(void* ws, std::size_t& ws_bytes, const float* g, float* r, std::size_t n, std::size_t k,
                        std::uint32_t* idx, float* val) {
  return encode_entry(ws, ws_bytes, g, r, n, k, false, idx, val);
}

std::size_t topk_encode_sampled(void* ws, std::size_t& ws_bytes, const float* g, float* r, std::size_t n,
                                std::size_t k, std::uint32_t* idx, float* val) {
  return encode_entry(ws, ws_bytes, g, r, n, k, true, idx, val);
}

void topk_decode(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t begin, std::size_t end,
                 float* out, Combine c) {
  if (begin >= end) return;
  // The entries inside [begin, end): indices are strictly increasing.
  const std::size_t j0 = static_cast<std::size_t>(std::lower_bound(idx, idx + k, begin) - idx);
  const std::size_t j1 = static_cast<std::size_t>(std::lower_bound(idx + j0, idx + k, end) - idx);
  if (!c.accumulate) {
    std::fill(out, out + (end - begin), c.scaled() ? 0.0f * c.scale : 0.0f);
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

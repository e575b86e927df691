// CUDA top-k by magnitude, fused with error feedback: the twin of
// kernels/topk_cpu.cc (same sample, same bound, same entries, same residual).
//
// Words used below (as in topk_cpu.cc):
//   - key: topk_key(v), the 31-bit magnitude key.
//   - composite key: (key, ~index), 63 bits. Ordering by it is "larger |v|
//     first, then lower index", so the top k of composite keys is exactly the
//     codec's selection, with no ties left. A radix select over it runs the 3
//     key digits of kernels/topk.h, then, only when elements tie at the
//     threshold key, 3 digits of ~index (11/11/10 bits).
//   - bound L: from a one-block radix select over kTopkSample sampled keys.
//   - candidates: the (index, v) pairs with key >= L, in index order.
//   - tile: 256 threads x 16 consecutive items; an ordered compaction gives
//     each tile its output offset by decoupled look-back (each tile publishes
//     its count, then its inclusive prefix; a tile sums its predecessors'
//     counts, 32 at a time, back to the nearest inclusive prefix).
//
// Launch sequence (all on one stream, no host synchronization; kernels that a
// device-side decision makes idle return at once):
//   memset(control, histograms, tile states)
//   sample   1 block: bound L (0 when the selection runs over everything)
//   filter   v = g + r, r = v; candidates with key >= L, in index order
//   plan     1 thread: candidates path, whole-array path (L missed), or
//            take-all (select=sample with a count inside the bound)
//   6 x (histogram over the chosen source, select one digit in 1 block)
//   emit     ordered compaction of the selected entries into the payload,
//            residual of each sent entry = ef_residual(v, v)
#include <cub/block/block_scan.cuh>
#include <cuda/atomic>

#include "common/workspace.h"
#include "kernels/cpu.h"
#include "kernels/cuda_common.cuh"
#include "kernels/error_feedback.h"
#include "kernels/topk.h"

namespace gz::kernels::cuda {
namespace {

using namespace detail;

constexpr int kTileThreads = 256;
constexpr int kTileItems = 16;
constexpr unsigned kTile = kTileThreads * kTileItems;  // 4096 items
constexpr int kSelectThreads = 1024;
constexpr int kSampleItems = static_cast<int>(kTopkSample) / kSelectThreads;
constexpr int kMaxBins = 2048;
constexpr int kDigits = 6;  // 3 over the key, 3 over ~index
static_assert(kSampleItems * kSelectThreads == static_cast<int>(kTopkSample));

enum Path : unsigned { kPathCandidates = 0, kPathFull = 1, kPathTakeAll = 2 };

// Device-side state of one encode; zeroed by the memset that opens it.
struct Control {
  unsigned bound;       // candidates: key >= bound
  unsigned path;        // Path
  unsigned cand_count;  // keys >= bound (may exceed the capacity)
  unsigned active;      // items in the chosen source
  unsigned out_count;   // entries the payload gets
  unsigned remaining;   // entries still to place below the decided prefix
  unsigned prefix_hi;   // decided key bits (the threshold key once 3 digits are done)
  unsigned mask_hi;
  unsigned prefix_lo;   // decided ~index bits
  unsigned mask_lo;
  unsigned index_pass;  // 1 when elements tie at the threshold key beyond the ones taken
  unsigned cut;         // of the elements at the threshold key, those with index <= cut are taken
  unsigned filter_tiles;
  unsigned emit_tiles;
};

// Digit D of the composite key: D < 3 over the key (kernels/topk.h), else over ~index.
template <int D>
struct Digit {
  static constexpr bool kIndex = D >= kTopkDigits;
  static constexpr int kIndexShift[3] = {21, 10, 0};
  static constexpr int kIndexBits[3] = {11, 11, 10};
  static constexpr int kShift = kIndex ? kIndexShift[kIndex ? D - 3 : 0] : kTopkDigitShift[kIndex ? 0 : D];
  static constexpr int kBits = kIndex ? kIndexBits[kIndex ? D - 3 : 0] : kTopkDigitBits[kIndex ? 0 : D];
  static constexpr unsigned kBins = 1u << kBits;
  __device__ static unsigned of(unsigned x) { return (x >> kShift) & (kBins - 1); }
};

// ---- workspace --------------------------------------------------------------

struct Layout {
  Control* ctl = nullptr;
  unsigned* hist = nullptr;  // kDigits x kMaxBins
  unsigned long long* filter_state = nullptr;
  unsigned long long* emit_state = nullptr;
  unsigned* cand_idx = nullptr;
  float* cand_val = nullptr;
  std::size_t tiles = 0;
  std::size_t cap = 0;
  std::size_t zero_bytes = 0;  // the prefix that the opening memset clears
};

std::size_t carve(void* ws, std::size_t ws_bytes, std::size_t n, std::size_t k, Layout* out) {
  WorkspaceCarver c(ws, ws_bytes);
  Layout l;
  l.tiles = (n + kTile - 1) / kTile;
  l.cap = topk_candidate_capacity(n, k < n ? k : n);
  l.ctl = c.add<Control>(1);
  l.hist = c.add<unsigned>(kDigits * kMaxBins);
  l.filter_state = c.add<unsigned long long>(l.tiles);
  l.emit_state = c.add<unsigned long long>(l.tiles);
  l.zero_bytes = c.bytes();
  l.cand_idx = c.add<unsigned>(l.cap);
  l.cand_val = c.add<float>(l.cap);
  c.check();
  if (out) *out = l;
  return c.bytes();
}

// ---- block-level radix step -------------------------------------------------

struct BinChoice {
  unsigned bin;
  unsigned above;  // items in higher bins
};

// The bin holding the `remaining`-th largest item, scanning from the top as
// radix_threshold does in topk_cpu.cc. All kSelectThreads threads call it.
template <unsigned kBins>
__device__ BinChoice select_bin(const unsigned* hist, unsigned remaining) {
  using Scan = cub::BlockScan<unsigned, kSelectThreads>;
  constexpr int kPer = (kBins + kSelectThreads - 1) / kSelectThreads;
  __shared__ typename Scan::TempStorage temp;
  __shared__ BinChoice choice;
  unsigned count[kPer];
  unsigned sum = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const unsigned p = threadIdx.x * kPer + q;  // position counted from the top bin
    count[q] = p < kBins ? hist[kBins - 1 - p] : 0u;
    sum += count[q];
  }
  unsigned before = 0, total = 0;
  Scan(temp).ExclusiveSum(sum, before, total);
  if (threadIdx.x == 0) choice = BinChoice{0, total - hist[0]};  // fewer than `remaining`: bin 0, as on the CPU
  __syncthreads();
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (before < remaining && remaining <= before + count[q])
      choice = BinChoice{kBins - 1 - (threadIdx.x * kPer + q), before};
    before += count[q];
  }
  __syncthreads();
  const BinChoice result = choice;
  __syncthreads();  // `choice` and `temp` are reused by the next call
  return result;
}

// ---- decoupled look-back ------------------------------------------------------

constexpr unsigned kFlagAggregate = 1, kFlagInclusive = 2;

__device__ __forceinline__ unsigned long long pack_state(unsigned flag, unsigned value) {
  return (static_cast<unsigned long long>(flag) << 32) | value;
}

__device__ __forceinline__ void store_state(unsigned long long* s, unsigned long long v) {
  ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device>(*s).store(v, ::cuda::std::memory_order_relaxed);
}

__device__ __forceinline__ unsigned long long load_state(unsigned long long* s) {
  return ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device>(*s).load(::cuda::std::memory_order_relaxed);
}

// Called by the 32 lanes of one warp for `tile` (tiles are taken in order from
// a counter, so every earlier tile belongs to a block that is running or has
// finished). Publishes the tile's count and returns the sum of all earlier
// tiles' counts. Flag and value share one 64-bit word, so relaxed order suffices.
__device__ unsigned lookback(unsigned long long* state, unsigned tile, unsigned aggregate) {
  const unsigned lane = threadIdx.x & 31;
  if (tile == 0) {
    if (lane == 0) store_state(&state[0], pack_state(kFlagInclusive, aggregate));
    return 0;
  }
  if (lane == 0) store_state(&state[tile], pack_state(kFlagAggregate, aggregate));
  unsigned exclusive = 0;
  long long top = static_cast<long long>(tile) - 1;
  while (true) {
    const long long j = top - lane;  // lane 0 looks at the nearest predecessor
    unsigned long long s = pack_state(kFlagInclusive, 0);  // before tile 0: an empty prefix
    if (j >= 0) {
      do {
        s = load_state(&state[j]);
      } while ((s >> 32) == 0);
    }
    __syncwarp();
    const unsigned inclusive = __ballot_sync(kFullMask, (s >> 32) == kFlagInclusive);
    const unsigned last = inclusive ? __ffs(inclusive) - 1 : 31;  // lanes 0..last count
    exclusive += __reduce_add_sync(kFullMask, lane <= last ? static_cast<unsigned>(s) : 0u);
    if (inclusive) break;
    top -= 32;
  }
  if (lane == 0) store_state(&state[tile], pack_state(kFlagInclusive, exclusive + aggregate));
  return exclusive;
}

// Block-wide ordered compaction of one tile: each thread passes the bit mask of
// its selected items; returns the output position of the thread's first one.
// Every thread of the block calls it.
__device__ unsigned tile_offset(unsigned long long* state, unsigned tile, unsigned mask, unsigned* total) {
  using Scan = cub::BlockScan<unsigned, kTileThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ unsigned tile_prefix;
  unsigned offset = 0, aggregate = 0;
  Scan(temp).ExclusiveSum(static_cast<unsigned>(__popc(mask)), offset, aggregate);
  if (threadIdx.x < 32) {
    const unsigned prefix = lookback(state, tile, aggregate);
    if (threadIdx.x == 0) tile_prefix = prefix;
  }
  __syncthreads();
  const unsigned prefix = tile_prefix;
  __syncthreads();  // temp and tile_prefix are reused by the next tile
  if (total) *total = prefix + aggregate;
  return prefix + offset;
}

// Takes the next tile from a counter; all threads get the same number.
__device__ __forceinline__ unsigned next_tile(unsigned* counter) {
  __shared__ unsigned tile;
  if (threadIdx.x == 0) tile = atomicAdd(counter, 1u);
  __syncthreads();
  const unsigned t = tile;
  __syncthreads();
  return t;
}

// ---- loaders ----------------------------------------------------------------

template <bool kEf, class G>
__device__ __forceinline__ float input(const G* __restrict__ g, const float* __restrict__ r, std::size_t i) {
  return ef_input<kEf>(g, r, i);
}

// 16 consecutive items of the chosen source: the whole array (index = position)
// or the candidate list. Items past `count` get index 0, value 0 and are invalid.
struct Items {
  unsigned idx[kTileItems];
  float v[kTileItems];
};

__device__ __forceinline__ void load_items(unsigned path, const float* __restrict__ src, bool src_vec,
                                           const unsigned* __restrict__ cand_idx,
                                           const float* __restrict__ cand_val, std::size_t count,
                                           std::size_t base, Items& it) {
  const bool full = base + kTileItems <= count;
  if (path == kPathFull) {
    if (full && src_vec) {
#pragma unroll
      for (int q = 0; q < kTileItems / 4; ++q) {
        const float4 a = reinterpret_cast<const float4*>(src + base)[q];
        it.v[4 * q] = a.x, it.v[4 * q + 1] = a.y, it.v[4 * q + 2] = a.z, it.v[4 * q + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kTileItems; ++e) it.v[e] = base + e < count ? src[base + e] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) it.idx[e] = static_cast<unsigned>(base + e);
    return;
  }
  if (full) {  // the candidate arrays are 256-byte aligned and base is a multiple of 16
#pragma unroll
    for (int q = 0; q < kTileItems / 4; ++q) {
      const uint4 a = reinterpret_cast<const uint4*>(cand_idx + base)[q];
      const float4 b = reinterpret_cast<const float4*>(cand_val + base)[q];
      it.idx[4 * q] = a.x, it.idx[4 * q + 1] = a.y, it.idx[4 * q + 2] = a.z, it.idx[4 * q + 3] = a.w;
      it.v[4 * q] = b.x, it.v[4 * q + 1] = b.y, it.v[4 * q + 2] = b.z, it.v[4 * q + 3] = b.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) {
      const bool ok = base + e < count;
      it.idx[e] = ok ? cand_idx[base + e] : 0u;
      it.v[e] = ok ? cand_val[base + e] : 0.0f;
    }
  }
}

// ---- kernels ----------------------------------------------------------------

// One block: the bound L = the rank-th largest of the sampled keys (exactly
// what topk_cpu.cc's sample_bound computes); rank 0 gives L = 0.
template <bool kEf, class G>
__global__ void __launch_bounds__(kSelectThreads)
    sample_kernel(const G* __restrict__ g, const float* __restrict__ r, std::size_t n, unsigned k,
                  unsigned rank, Control* ctl) {
  __shared__ unsigned hist[kMaxBins];
  if (threadIdx.x == 0) {
    ctl->remaining = k;
    ctl->cut = 0xFFFFFFFFu;
  }
  if (rank == 0) {
    if (threadIdx.x == 0) ctl->bound = 0;
    return;
  }
  unsigned keys[kSampleItems];
#pragma unroll
  for (int s = 0; s < kSampleItems; ++s)
    keys[s] = topk_key(input<kEf>(g, r, topk_sample_position(threadIdx.x + s * kSelectThreads, n)));
  unsigned prefix = 0, mask = 0, remaining = rank;
  auto step = [&](auto digit) {
    using Dg = decltype(digit);
    for (unsigned b = threadIdx.x; b < Dg::kBins; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kSampleItems; ++s)
      if ((keys[s] & mask) == prefix) atomicAdd(&hist[Dg::of(keys[s])], 1u);
    __syncthreads();
    const BinChoice c = select_bin<Dg::kBins>(hist, remaining);
    remaining -= c.above;
    prefix |= c.bin << Dg::kShift;
    mask |= (Dg::kBins - 1) << Dg::kShift;
  };
  step(Digit<0>{});
  step(Digit<1>{});
  step(Digit<2>{});
  if (threadIdx.x == 0) ctl->bound = prefix;
}

// v = g + r (r = v), and the ordered list of candidates (key >= bound).
template <bool kEf, class G>
__global__ void __launch_bounds__(kTileThreads)
    filter_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::size_t tiles,
                  std::size_t cap, Control* ctl, unsigned long long* state, unsigned* __restrict__ cand_idx,
                  float* __restrict__ cand_val, bool vec) {
  const unsigned bound = ctl->bound;
  for (unsigned tile = next_tile(&ctl->filter_tiles); tile < tiles; tile = next_tile(&ctl->filter_tiles)) {
    const std::size_t base = static_cast<std::size_t>(tile) * kTile + threadIdx.x * kTileItems;
    float v[kTileItems];
    if (vec && base + kTileItems <= n) {
#pragma unroll
      for (int q = 0; q < kTileItems / 4; ++q) {
        float4 a = reinterpret_cast<const float4*>(g + base)[q];
        if constexpr (kEf) {
          const float4 b = reinterpret_cast<const float4*>(r + base)[q];
          a.x = a.x + b.x, a.y = a.y + b.y, a.z = a.z + b.z, a.w = a.w + b.w;
          reinterpret_cast<float4*>(r + base)[q] = a;
        }
        v[4 * q] = a.x, v[4 * q + 1] = a.y, v[4 * q + 2] = a.z, v[4 * q + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kTileItems; ++e) {
        v[e] = 0.0f;
        if (base + e < n) {
          v[e] = input<kEf>(g, r, base + e);
          if constexpr (kEf) r[base + e] = v[e];
        }
      }
    }
    unsigned mask = 0;
#pragma unroll
    for (int e = 0; e < kTileItems; ++e)
      mask |= static_cast<unsigned>(base + e < n && topk_key(v[e]) >= bound) << e;
    unsigned total = 0;
    unsigned pos = tile_offset(state, tile, mask, &total);
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) {
      if ((mask >> e) & 1u) {
        if (pos < cap) {
          cand_idx[pos] = static_cast<unsigned>(base + e);
          cand_val[pos] = v[e];
        }
        ++pos;
      }
    }
    if (tile == tiles - 1 && threadIdx.x == 0) ctl->cand_count = total;
  }
}

// Chooses the source of the exact selection (the decision topk_cpu.cc makes).
__global__ void plan_kernel(Control* ctl, unsigned n, unsigned k, unsigned cap, bool take_all_ok, unsigned min_count,
                            unsigned max_count) {
  const unsigned c = ctl->cand_count;
  if (take_all_ok && c >= min_count && c <= max_count && c <= cap) {
    ctl->path = kPathTakeAll;
    ctl->active = c;
    ctl->out_count = c;
  } else if (c >= k && c <= cap) {
    ctl->path = kPathCandidates;
    ctl->active = c;
    ctl->out_count = k;
  } else {
    ctl->path = kPathFull;
    ctl->active = n;
    ctl->out_count = k;
  }
}

// Histogram of digit D over the items that match the decided prefix.
template <int D>
__global__ void __launch_bounds__(kTileThreads)
    histogram_kernel(const Control* ctl, const float* __restrict__ src, bool src_vec,
                     const unsigned* __restrict__ cand_idx, const float* __restrict__ cand_val,
                     unsigned* __restrict__ hist) {
  using Dg = Digit<D>;
  const unsigned path = ctl->path;
  if (path == kPathTakeAll || (Dg::kIndex && !ctl->index_pass)) return;
  const std::size_t count = ctl->active;
  const unsigned prefix_hi = ctl->prefix_hi, mask_hi = ctl->mask_hi;
  const unsigned prefix_lo = ctl->prefix_lo, mask_lo = ctl->mask_lo;
  __shared__ unsigned h[Dg::kBins];
  for (unsigned b = threadIdx.x; b < Dg::kBins; b += kTileThreads) h[b] = 0;
  __syncthreads();
  const std::size_t tiles = (count + kTile - 1) / kTile;
  const unsigned lane = threadIdx.x & 31;
  for (std::size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    Items it;
    load_items(path, src, src_vec, cand_idx, cand_val, count, tile * kTile + threadIdx.x * kTileItems, it);
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) {
      const std::size_t j = tile * kTile + threadIdx.x * kTileItems + e;
      const unsigned key = topk_key(it.v[e]);
      bool match;
      unsigned bin;
      if constexpr (Dg::kIndex) {
        const unsigned inv = ~it.idx[e];
        match = j < count && key == prefix_hi && (inv & mask_lo) == prefix_lo;
        bin = Dg::of(inv);
      } else {
        match = j < count && (key & mask_hi) == prefix_hi;
        bin = Dg::of(key);
      }
      // Lanes adding to the same bin add once (skewed data, e.g. many zeros, hits one bin).
      const unsigned slot = match ? bin : 0xFFFFFFFFu;
      const unsigned peers = __match_any_sync(kFullMask, slot);
      if (match && lane == static_cast<unsigned>(__ffs(peers) - 1)) atomicAdd(&h[bin], __popc(peers));
    }
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < Dg::kBins; b += kTileThreads)
    if (h[b]) atomicAdd(&hist[D * kMaxBins + b], h[b]);
}

// One block: fixes digit D of the threshold.
template <int D>
__global__ void __launch_bounds__(kSelectThreads) select_kernel(Control* ctl, const unsigned* __restrict__ hist) {
  using Dg = Digit<D>;
  if (ctl->path == kPathTakeAll || (Dg::kIndex && !ctl->index_pass)) return;
  const unsigned remaining = ctl->remaining;
  const BinChoice c = select_bin<Dg::kBins>(hist + D * kMaxBins, remaining);
  if (threadIdx.x != 0) return;
  const unsigned left = remaining - c.above;
  ctl->remaining = left;
  if constexpr (Dg::kIndex) {
    ctl->prefix_lo |= c.bin << Dg::kShift;
    ctl->mask_lo |= (Dg::kBins - 1) << Dg::kShift;
    if (D == kDigits - 1) ctl->cut = ~ctl->prefix_lo;
  } else {
    ctl->prefix_hi |= c.bin << Dg::kShift;
    ctl->mask_hi |= (Dg::kBins - 1) << Dg::kShift;
    if (D == kTopkDigits - 1) {
      // hist bin = every element whose key equals the threshold; take them all, or run the index digits.
      const unsigned equal = hist[D * kMaxBins + c.bin];
      ctl->index_pass = left < equal ? 1u : 0u;
      ctl->cut = 0xFFFFFFFFu;
    }
  }
}

// Ordered compaction of the selected entries into the payload body.
template <bool kEf>
__global__ void __launch_bounds__(kTileThreads)
    emit_kernel(Control* ctl, const float* __restrict__ src, bool src_vec, const unsigned* __restrict__ cand_idx,
                const float* __restrict__ cand_val, float* __restrict__ r, unsigned long long* state,
                unsigned* __restrict__ body, Blob32 head) {
  store_blob(head);
  const unsigned path = ctl->path;
  const std::size_t count = ctl->active;
  const unsigned out_count = ctl->out_count, threshold = ctl->prefix_hi, cut = ctl->cut;
  float* values = reinterpret_cast<float*>(body + out_count);
  const std::size_t tiles = (count + kTile - 1) / kTile;
  for (unsigned tile = next_tile(&ctl->emit_tiles); tile < tiles; tile = next_tile(&ctl->emit_tiles)) {
    const std::size_t base = static_cast<std::size_t>(tile) * kTile + threadIdx.x * kTileItems;
    Items it;
    load_items(path, src, src_vec, cand_idx, cand_val, count, base, it);
    unsigned mask = 0;
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) {
      const unsigned key = topk_key(it.v[e]);
      const bool take = path == kPathTakeAll || key > threshold || (key == threshold && it.idx[e] <= cut);
      mask |= static_cast<unsigned>(base + e < count && take) << e;
    }
    unsigned pos = tile_offset(state, tile, mask, nullptr);
#pragma unroll
    for (int e = 0; e < kTileItems; ++e) {
      if ((mask >> e) & 1u) {
        if (pos < out_count) {  // exactly out_count entries pass; the guard keeps a bug inside the payload
          body[pos] = it.idx[e];
          values[pos] = it.v[e];
          if constexpr (kEf) r[it.idx[e]] = ef_residual(it.v[e], it.v[e]);
        }
        ++pos;
      }
    }
  }
}

// k >= n: every element, in order.
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    select_all_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, unsigned* __restrict__ body,
                      Control* ctl, Blob32 head) {
  store_blob(head);
  if (global_thread() == 0) ctl->out_count = static_cast<unsigned>(n);
  float* values = reinterpret_cast<float*>(body + n);
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = input<kEf>(g, r, i);
    body[i] = static_cast<unsigned>(i);
    values[i] = v;
    if constexpr (kEf) r[i] = ef_residual(v, v);
  }
}

// k == 0: nothing is sent, everything is carried (r += g).
template <class G>
__global__ void __launch_bounds__(kThreads)
    carry_all_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, Blob32 head) {
  store_blob(head);
  if (!r) return;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) r[i] = ef_input<true>(g, r, i);
}

__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const unsigned* __restrict__ idx, const float* __restrict__ val, std::size_t k,
                   float* __restrict__ out, Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  // Overwrite: out was just set to the untouched value; indices are distinct.
  for (std::size_t j = global_thread(); j < k; j += grid_threads())
    out[idx[j]] = c.accumulate ? out[idx[j]] + val[j] : combine(0.0f, val[j], c);
}

// The elements a sparse payload does not name: overwrite sets them (and the
// named ones, rewritten next) to the scaled zero; accumulate scales every
// element after the scatter.
__global__ void __launch_bounds__(kThreads)
    fill_or_scale_kernel(float* __restrict__ out, std::size_t n, Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  const float zero = apply_scale(0.0f, c);
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = c.accumulate ? out[i] * c.scale : zero;
}

// ---- a 16-bit output (DecodeOut): the float rule of the kernels above, each
// element rounded once; one dense pass over out, the others over the entries.

// Overwrite: every element the scaled zero; the named ones are written next.
template <class T>
__global__ void __launch_bounds__(kThreads)
    fill16_kernel(T* __restrict__ out, std::size_t n, Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  const T zero = from_float<T>(apply_scale(0.0f, c));
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = zero;
}

// Overwrite: the named elements, after fill16_kernel.
template <class T>
__global__ void __launch_bounds__(kThreads)
    put16_kernel(const unsigned* __restrict__ idx, const float* __restrict__ val, std::size_t k, T* __restrict__ out,
                 Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t j = global_thread(); j < k; j += grid_threads()) out[idx[j]] = from_float<T>(combine(0.0f, val[j], c));
}

// A sum's last payload: out = round(partial, scaled), the entries added into
// the float partial first (scatter_kernel, unscaled).
template <class T>
__global__ void __launch_bounds__(kThreads)
    round16_kernel(const float* __restrict__ partial, std::size_t n, T* __restrict__ out, Combine c,
                   const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    out[i] = from_float<T>(apply_scale(partial[i], c));
}

// A single accumulate: the named elements' sums, from out before it changes,
// into sums[j] (scaled with the rest by the next passes' rule).
template <class T>
__global__ void __launch_bounds__(kThreads)
    gather16_kernel(const unsigned* __restrict__ idx, const float* __restrict__ val, std::size_t k,
                    const T* __restrict__ out, float* __restrict__ sums, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t j = global_thread(); j < k; j += grid_threads()) sums[j] = to_float(out[idx[j]]) + val[j];
}

// A single accumulate: every element rounded again (scaled when c says), then
// the named ones from their sums.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rescale16_kernel(T* __restrict__ out, std::size_t n, Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = from_float<T>(apply_scale(to_float(out[i]), c));
}
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter16_kernel(const unsigned* __restrict__ idx, const float* __restrict__ sums, std::size_t k,
                     T* __restrict__ out, Combine c, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t j = global_thread(); j < k; j += grid_threads())
    out[idx[j]] = from_float<T>(apply_scale(sums[j], c));
}

template <bool kEf, class G>
void launch_select(const Layout& l, const G* g, float* r, std::size_t n, std::size_t k, bool sampled,
                   std::uint32_t* body, const Blob32& head, Stream stream) {
  const std::uint64_t rank = topk_sample_rank(n, k, sampled);
  sample_kernel<kEf><<<1, kSelectThreads, 0, stream>>>(g, r, n, static_cast<unsigned>(k),
                                                       static_cast<unsigned>(rank), l.ctl);
  GZ_LAUNCH_CHECK(sample_kernel);

  const int sms = sm_count();
  const unsigned tile_grid = static_cast<unsigned>(l.tiles < static_cast<std::size_t>(sms) * 8 ? l.tiles : sms * 8);
  const bool vec = vec_gradient(g) && (!kEf || aligned16(r));
  filter_kernel<kEf><<<tile_grid, kTileThreads, 0, stream>>>(g, r, n, l.tiles, l.cap, l.ctl, l.filter_state,
                                                             l.cand_idx, l.cand_val, vec);
  GZ_LAUNCH_CHECK(filter_kernel);

  // select=sample may send the candidates as they are; never in direct mode (rank 0), as on the CPU.
  plan_kernel<<<1, 1, 0, stream>>>(l.ctl, static_cast<unsigned>(n), static_cast<unsigned>(k),
                                   static_cast<unsigned>(l.cap), sampled && rank != 0,
                                   static_cast<unsigned>(cpu::topk_sampled_min(k)),
                                   static_cast<unsigned>(cpu::topk_sampled_max(k)));
  GZ_LAUNCH_CHECK(plan_kernel);

  const float* src = values_of<kEf>(g, r);  // where v lives once the filter ran
  const bool src_vec = aligned16(src);
  const unsigned hist_grid = static_cast<unsigned>(l.tiles < static_cast<std::size_t>(sms) * 4 ? l.tiles : sms * 4);
  auto digit = [&](auto d) {
    constexpr int D = decltype(d)::value;
    histogram_kernel<D><<<hist_grid, kTileThreads, 0, stream>>>(l.ctl, src, src_vec, l.cand_idx, l.cand_val, l.hist);
    GZ_LAUNCH_CHECK(histogram_kernel);
    select_kernel<D><<<1, kSelectThreads, 0, stream>>>(l.ctl, l.hist);
    GZ_LAUNCH_CHECK(select_kernel);
  };
  digit(std::integral_constant<int, 0>{});
  digit(std::integral_constant<int, 1>{});
  digit(std::integral_constant<int, 2>{});
  digit(std::integral_constant<int, 3>{});
  digit(std::integral_constant<int, 4>{});
  digit(std::integral_constant<int, 5>{});

  emit_kernel<kEf><<<tile_grid, kTileThreads, 0, stream>>>(l.ctl, src, src_vec, l.cand_idx, l.cand_val, r,
                                                           l.emit_state, body, head);
  GZ_LAUNCH_CHECK(emit_kernel);
}

}  // namespace

template <class G>
void topk_encode(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n, std::size_t k,
                 bool sampled, std::uint32_t* body, const Blob32& head, const std::uint32_t** count_out,
                 Stream stream) {
  if (!ws) {
    ws_bytes = carve(nullptr, 0, n, k, nullptr);
    return;
  }
  GZ_ENFORCE_LE(n, std::size_t{0xFFFFFFFFu}, "topk indexes elements with u32");
  Layout l;
  carve(ws, ws_bytes, n, k, &l);
  k = k < n ? k : n;
  if (count_out) *count_out = &l.ctl->out_count;
  GZ_CUDA_CHECK(cudaMemsetAsync(ws, 0, l.zero_bytes, stream));
  if (k == n) {  // everything (n == 0 included)
    const unsigned grid = grid_for(n);
    if (r)
      select_all_kernel<true><<<grid, kThreads, 0, stream>>>(g, r, n, body, l.ctl, head);
    else
      select_all_kernel<false><<<grid, kThreads, 0, stream>>>(g, r, n, body, l.ctl, head);
    GZ_LAUNCH_CHECK(select_all_kernel);
    return;
  }
  if (k == 0) {
    carry_all_kernel<<<grid_for(n), kThreads, 0, stream>>>(g, r, n, head);
    GZ_LAUNCH_CHECK(carry_all_kernel);
    return;
  }
  if constexpr (std::is_same_v<G, float>) {
    if (!r) return launch_select<false>(l, g, r, n, k, sampled, body, head, stream);
  } else {
    GZ_ENFORCE(r != nullptr, "topk: a 16-bit gradient needs a residual here");  // compressors/topk.cc widens
  }
  launch_select<true>(l, g, r, n, k, sampled, body, head, stream);
}

#define GZ_INSTANTIATE(G)                                                                                    \
  template void topk_encode(void*, std::size_t&, const G*, float*, std::size_t, std::size_t, bool, std::uint32_t*, \
                            const Blob32&, const std::uint32_t**, Stream);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

namespace {

void decode_float(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t n, float* out, Combine c,
                  const std::uint32_t* gate, Stream stream) {
  if (!c.accumulate) {
    fill_or_scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, n, c, gate);
    GZ_LAUNCH_CHECK(fill_or_scale_kernel);
  }
  if (k > 0) {
    scatter_kernel<<<grid_for(k), kThreads, 0, stream>>>(idx, val, k, out, c, gate);
    GZ_LAUNCH_CHECK(scatter_kernel);
  }
  if (c.accumulate && c.scaled()) {
    fill_or_scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, n, c, gate);
    GZ_LAUNCH_CHECK(fill_or_scale_kernel);
  }
}

// The CPU's bits (a float tile rounded once, compressors/codec.cc), including
// the unnamed elements, which the tile widens and rounds again (a NaN quieted).
template <class T>
void decode_16(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t n, T* out, const DecodeOut& o,
               Combine c, const std::uint32_t* gate, Stream stream) {
  const unsigned kgrid = grid_for(k), ngrid = grid_for(n);
  if (!c.accumulate) {
    fill16_kernel<<<ngrid, kThreads, 0, stream>>>(out, n, c, gate);
    GZ_LAUNCH_CHECK(fill16_kernel);
    if (k == 0) return;
    put16_kernel<<<kgrid, kThreads, 0, stream>>>(idx, val, k, out, c, gate);
    GZ_LAUNCH_CHECK(put16_kernel);
  } else if (o.partial) {
    if (k > 0) {
      scatter_kernel<<<kgrid, kThreads, 0, stream>>>(idx, val, k, o.partial, Combine{true, 1.0f}, gate);
      GZ_LAUNCH_CHECK(scatter_kernel);
    }
    round16_kernel<<<ngrid, kThreads, 0, stream>>>(o.partial, n, out, c, gate);
    GZ_LAUNCH_CHECK(round16_kernel);
  } else {
    GZ_ENFORCE(k == 0 || o.scratch, "topk: a 16-bit accumulate needs DecodeOut::scratch");
    if (k > 0) {
      gather16_kernel<<<kgrid, kThreads, 0, stream>>>(idx, val, k, out, o.scratch, gate);
      GZ_LAUNCH_CHECK(gather16_kernel);
    }
    rescale16_kernel<<<ngrid, kThreads, 0, stream>>>(out, n, c, gate);
    GZ_LAUNCH_CHECK(rescale16_kernel);
    if (k > 0) {
      scatter16_kernel<<<kgrid, kThreads, 0, stream>>>(idx, o.scratch, k, out, c, gate);
      GZ_LAUNCH_CHECK(scatter16_kernel);
    }
  }
}

}  // namespace

void topk_decode(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t n, const DecodeOut& out,
                 Combine c, const std::uint32_t* gate, Stream stream) {
  if (n == 0) return;
  with_elements(out.dtype, out.out, [&](auto* o) {
    using T = std::remove_pointer_t<decltype(o)>;
    if constexpr (std::is_same_v<T, float>)
      decode_float(idx, val, k, n, o, c, gate, stream);
    else
      decode_16(idx, val, k, n, o, out, c, gate, stream);
  });
}

}  // namespace gz::kernels::cuda
